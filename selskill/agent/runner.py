"""The episode runner: policy + episode host for many episodes at once.

Episodes run concurrently (one batched `generate` per turn across all live episodes) and
each request carries its own seed, so an episode's samples do not depend on which other
episodes share its batch. The turns themselves are the `EpisodeHost`'s
(`selskill.agent.episode_host`); with `env_overlap` the host runs in a child process
(`selskill.agent.host_process`) and the runner alternates two half-batches, so one half's
environments step while the other half's turn is generated.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from selskill.agent.action_choice import ActionChoice, ActionVocabulary, check_action_choice
from selskill.agent.chat_tokens import ChatTokens
from selskill.agent.episode_host import EpisodeHost, EpisodeSpec
from selskill.agent.hooks import EpisodeHooks
from selskill.agent.host_process import LocalHost, ProcessHost, picklable
from selskill.agent.turn_format import TurnFormat
from selskill.config.rollout import RolloutConfig
from selskill.data.records import Episode
from selskill.envs.base import Env
from selskill.policy.base import GenerationRequest, Policy, SamplingParams
from selskill.skills import SkillLibrary, render_listing
from selskill.skills.pseudo_skills import generate_pseudo_skills_batch
from selskill.skills.retrieval import SkillRetriever

ROLLOUT_KEYS = {
    "pseudo_skills": "retrieval_pseudo_skills",
    "pseudo_skill_tokens": "retrieval_pseudo_max_new_tokens",
}
# what each stage samples with (sample and fork: their section's; eval: greedy), not the rollout section
STAGE_KEYS = ("temperature", "top_p")


@dataclass(frozen=True)
class RunnerConfig:
    """How the runner plays episodes: the rollout section's keys (`of`) and the stage's sampling.

    Every field but `STAGE_KEYS` is a rollout key of the same name (or `ROLLOUT_KEYS`' name), and
    its default is that key's default.
    """

    # the step budget: every decision (action, skill call, malformed turn) is one step
    max_decisions: int = RolloutConfig.max_decisions
    # a safety cap on environment commands, not the budget (an executable skill runs several)
    max_env_steps: int = RolloutConfig.max_env_steps
    max_context_tokens: int = RolloutConfig.max_context_tokens
    max_new_tokens: int = RolloutConfig.max_new_tokens
    temperature: float = 1.0
    top_p: float = 1.0
    concurrent_episodes: int = RolloutConfig.concurrent_episodes
    listing_style: str = RolloutConfig.listing_style
    # play episodes in a child process, half a batch at a time, so the environments step
    # while the policy generates (EpisodeRunner); needs a picklable env factory
    env_overlap: bool = RolloutConfig.env_overlap
    # free: the policy writes any command; admissible: once it opens `<action>`, only admissible
    # commands can follow; decision: every turn is one action or skill call (selskill/agent/action_choice.py)
    action_choice: str = RolloutConfig.action_choice
    # `task` retrieval: the policy writes pseudo-skills for each task first (SkillDreamer's PSG),
    # greedily, each of its answers at most `pseudo_skill_tokens` tokens
    pseudo_skills: bool = RolloutConfig.retrieval_pseudo_skills
    pseudo_skill_tokens: int = RolloutConfig.retrieval_pseudo_max_new_tokens

    @classmethod
    def of(cls, rollout: RolloutConfig, temperature: float, top_p: float = 1.0) -> RunnerConfig:
        """The runner config of the recipe's rollout section, sampling at `temperature` and `top_p`."""
        names = [f.name for f in dataclasses.fields(cls) if f.name not in STAGE_KEYS]
        keys = {name: getattr(rollout, ROLLOUT_KEYS.get(name, name)) for name in names}
        return cls(**keys, temperature=temperature, top_p=top_p)

    def __post_init__(self):
        check_action_choice(self.action_choice)


class EpisodeRunner:
    def __init__(
        self,
        policy: Policy,
        env_factory: Callable[[], Env],
        library: SkillLibrary,
        fmt: TurnFormat,
        config: RunnerConfig,
        chat_template_kwargs: dict | None = None,
        skill_text: str | None = None,
        retriever: SkillRetriever | None = None,
        hooks: EpisodeHooks | None = None,
    ):
        """`skill_text` replaces the rendered listing in the system prompt (eval modes);
        `retriever` lists the skills of each decision and `hooks` are the benchmark's (see `EpisodeHost`).

        With `config.env_overlap` and a picklable `env_factory` (e.g. a `functools.partial`),
        episodes are played by an `EpisodeHost` in a child process in two half-batches: the
        policy generates one half's turn while the child steps the other half's environments.
        """
        if config.pseudo_skills and (retriever is None or retriever.config.mode != "task"):
            raise ValueError("pseudo-skills feed task retrieval: they need a retriever in mode task")
        self.policy = policy
        self.config = config
        listing = (
            skill_text if skill_text is not None else render_listing(library, style=config.listing_style)
        )
        self._host_args = (
            env_factory,
            library,
            fmt,
            config,
            policy.tokenizer,
            chat_template_kwargs,
            listing,
            retriever,
            hooks,
        )
        self._chat = ChatTokens(policy.tokenizer, chat_template_kwargs)
        self.end_of_turn_id = self._chat.end_of_turn_id
        self._vocab = (
            ActionVocabulary(policy.tokenizer, self.end_of_turn_id)
            if config.action_choice != "free"
            else None
        )
        self.overlap = config.env_overlap and config.concurrent_episodes >= 2 and picklable(self._host_args)
        self._host = None
        self._pseudo: dict[str, tuple[str, ...]] = {}  # task id -> its pseudo-skills

    def _get_host(self):
        if self._host is None:
            if self.overlap:
                self._host = ProcessHost(self._host_args)
            else:
                self._host = LocalHost(EpisodeHost(*self._host_args))
        return self._host

    def close(self) -> None:
        """Stop the episode host process (if any); a later `run` starts a new one."""
        if self._host is not None:
            self._host.close()
            self._host = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def run(
        self, specs: Sequence[EpisodeSpec], progress: Callable[[int], None] | None = None
    ) -> list[Episode]:
        """Run every spec to its end; returns its `Episode`, in spec order."""
        params = SamplingParams(
            self.config.temperature, self.config.top_p, self.config.max_new_tokens, (self.end_of_turn_id,)
        )
        self._prefill_fork_prefixes(specs)
        host = self._get_host()
        specs = self._with_pseudo_skills(specs, host)
        groups = 2 if self.overlap else 1
        total = self.config.concurrent_episodes
        capacity = [total // groups + (1 if g < total % groups else 0) for g in range(groups)]
        finished: dict[str, Episode] = {}
        requests: dict[int, list | None] = {}

        def collect(g: int) -> None:
            reqs, done = host.result()
            requests[g] = reqs
            finished.update(done)
            if progress is not None and done:
                progress(len(done))

        try:
            host.submit("load", list(specs))
            host.result()
            for g in range(groups):
                host.submit("advance", g, capacity[g], None)
                collect(g)
            in_flight, g = None, 0
            while True:
                if in_flight is not None and (in_flight == g or not requests[g]):
                    collect(in_flight)
                    in_flight = None
                if not requests[g]:
                    if in_flight is None and not any(requests.values()):
                        break
                    g = (g + 1) % groups
                    continue
                batch = [
                    GenerationRequest(
                        ids,
                        seed=seed,
                        cache_key=key,
                        cache_from=cache_from,
                        constraint=None if choice is None else ActionChoice(self._vocab, *choice),
                    )
                    for ids, seed, key, cache_from, choice in requests[g]
                ]
                generations = [gens[0] for gens in self.policy.generate(batch, params)]
                if in_flight is not None:  # the other half's environments stepped meanwhile
                    collect(in_flight)
                host.submit("advance", g, capacity[g], generations)
                requests[g], in_flight, g = None, g, (g + 1) % groups
        except BaseException:
            self.close()  # a half-played batch must not leak into the next run
            raise
        return [finished[s.episode_id] for s in specs]

    def _with_pseudo_skills(self, specs: Sequence[EpisodeSpec], host) -> list[EpisodeSpec]:
        """`specs`, each new episode with its task's pseudo-skills (generated once per task per runner)."""
        specs = list(specs)
        if not self.config.pseudo_skills:
            return specs
        new = [s.fork is None and not s.pseudo_skills for s in specs]
        todo = sorted({s.task_id for s, n in zip(specs, new, strict=True) if n} - set(self._pseudo))
        if todo:
            host.submit("task_texts", todo)
            texts = host.result()
            made = generate_pseudo_skills_batch([texts[t] for t in todo], self._complete)
            self._pseudo.update({t: ps.skills for t, ps in zip(todo, made, strict=True)})
        return [
            dataclasses.replace(s, pseudo_skills=self._pseudo[s.task_id]) if n else s
            for s, n in zip(specs, new, strict=True)
        ]

    def _complete(self, prompts: Sequence[str]) -> list[str]:
        """The policy's greedy answers to `prompts`, each as the one user message of a chat."""
        params = SamplingParams(0.0, 1.0, self.config.pseudo_skill_tokens, (self.end_of_turn_id,))
        requests = [GenerationRequest(self._chat.opening([{"role": "user", "content": p}])) for p in prompts]
        return [
            self._chat.decode(self._chat.split_end(gens[0].token_ids)[0])
            for gens in self.policy.generate(requests, params)
        ]

    def _prefill_fork_prefixes(self, specs: Sequence[EpisodeSpec]) -> None:
        prefill = getattr(self.policy, "prefill", None)
        if prefill is None:
            return
        seen = set()
        for s in specs:
            f = s.fork
            if f is not None and f.cache_from and f.cache_from not in seen:
                seen.add(f.cache_from)
                prefill(f.token_ids, cache_key=f.cache_from)
