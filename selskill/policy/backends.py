"""Opening a policy on the backend its settings are for.

Each backend module imports its settings class (`selskill.policy.settings`); this module sits
above both, so the settings never import a backend.
"""

from __future__ import annotations

from selskill.policy.settings import HFSettings, VLLMSettings


def open_policy(path: str, settings: HFSettings | VLLMSettings):
    """The policy at `path` on the backend `settings` is for (each backend imported only when used)."""
    if isinstance(settings, VLLMSettings):
        from selskill.policy.vllm_backend import VLLMPolicy

        return VLLMPolicy(path, settings)
    from selskill.policy.hf import HFPolicy

    return HFPolicy(path, settings)
