"""TRL's DPOTrainer with a per-token loss mask and metrics split by pair kind; the loss stays TRL's.

TRL 1.16 computes every log-probability (policy and reference, on the fly or precomputed)
from `completion_mask`: tokens where it is 0 get label -100, a log-prob of exactly 0 and no
gradient. So the whole method is: a collator that puts our loss mask into `completion_mask`,
a `_prepare_dataset` that lets pre-tokenized rows through (the stock one re-tokenizes text),
and signature columns that keep the mask columns. Loss, reference handling, DeepSpeed/DDP,
precompute and logging stay TRL's. With `train_prefix_sharing` the same batches also run as
prefix trees (selskill.train.prefix_sharing), behind the model's forward, with the same loss.

The overridden hooks are private to trl: pyproject.toml allows one trl release line,
constraints.txt pins the release checked, and tests/test_train_trainer.py::test_trl_contract
fails loudly if an upgrade changes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from trl import DPOTrainer
from trl.trainer.dpo_trainer import DataCollatorForPreference
from trl.trainer.utils import pad

from selskill.data.schema import PAIR_KINDS
from selskill.errors import ExplainedError
from selskill.train import prefix_sharing
from selskill.train.pairs import KIND_IDS, TOKEN_COLUMNS

# The trl version the overrides were checked against, and every DPOTrainer method this class overrides
# (tests/test_train_trainer.py::test_trl_contract keeps both honest).
TRL_VERSION = "1.16.0"
OVERRIDDEN_HOOKS = (
    "_prepare_dataset",
    "_set_signature_columns_if_needed",
    "compute_ref_log_probs",
    "compute_loss",
    "_get_train_sampler",
)
EXTRA_COLUMNS = ("chosen_loss_mask", "rejected_loss_mask", "kind")


class TrainDiverged(ExplainedError):
    """The loss or the trained weights went non-finite: the run failed (exit status 1), and a model that
    computes nan must never be marked complete, as every later stage would sample, fork and score with it."""

    status = 1


DIVERGED_FIX = (
    "no model is marked complete. Change the recipe (a lower learning_rate, max_grad_norm > 0) or check "
    "the pairs, then rerun"
)


def nonfinite_weights(model) -> list[str]:
    """The trained parameters holding a nan or inf in this process (with ZeRO-3, its partition), in one
    device sync: a last step can break the weights with a finite loss. Any trainer's model (DPO or SFT)."""
    named = [(name, getattr(p, "ds_tensor", p)) for name, p in model.named_parameters() if p.requires_grad]
    named = [(name, t) for name, t in named if t.numel()]
    if not named:
        return []
    finite = torch.stack([torch.isfinite(t.detach()).all() for _, t in named]).tolist()
    return [name for (name, _), ok in zip(named, finite, strict=True) if not ok]


@dataclass
class MaskedPreferenceCollator(DataCollatorForPreference):
    """DataCollatorForPreference whose `completion_mask` is the row's loss mask instead of all-ones.

    Sequences are [prompt + chosen] for the first half of the batch and [prompt + rejected] for
    the second, right-padded, as TRL expects. Rows must already fit `max_length` (see
    selskill.train.pairs): this collator never truncates, so it can never cut a trained window.
    Adds `pair_kind` (0 episode, 1 local) for the per-kind metrics, and with `prefix_sharing`
    pair or branch the same pairs packed as prefix trees (selskill.train.prefix_sharing).
    """

    prefix_sharing: str = "none"

    def torch_call(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        input_ids, completion_mask = [], []
        for side in ("chosen", "rejected"):
            for ex in examples:
                ids = list(ex["prompt_ids"]) + list(ex[f"{side}_ids"])
                mask = [0] * len(ex["prompt_ids"]) + [int(m) for m in ex[f"{side}_loss_mask"]]
                if len(mask) != len(ids):
                    raise ValueError(
                        f"pair {ex.get('pair_id', '?')}: {side}_loss_mask has {len(ex[f'{side}_loss_mask'])} entries "
                        f"for {len(ex[f'{side}_ids'])} {side} tokens; build rows with selskill.train.pairs.build_examples"
                    )
                if self.max_length is not None and len(ids) > self.max_length:
                    raise ValueError(
                        f"pair {ex.get('pair_id', '?')}: {len(ids)} tokens exceed max_length={self.max_length}; fit "
                        f"rows with selskill.train.pairs.build_examples (it never cuts the trained window)"
                    )
                input_ids.append(torch.tensor(ids, dtype=torch.long))
                completion_mask.append(torch.tensor(mask, dtype=torch.long))
        attention_mask = [torch.ones_like(ids) for ids in input_ids]
        kw = {"padding_side": "right", "pad_to_multiple_of": self.pad_to_multiple_of}
        output = {
            "input_ids": pad(input_ids, padding_value=self.pad_token_id, **kw),
            "attention_mask": pad(attention_mask, padding_value=0, **kw),
            "completion_mask": pad(completion_mask, padding_value=0, **kw),
            "pair_kind": torch.tensor(
                [KIND_IDS[ex.get("kind", "episode")] for ex in examples], dtype=torch.long
            ),
        }
        for key in ("ref_chosen_logps", "ref_rejected_logps"):
            if key in examples[0]:
                output[key] = torch.tensor([ex[key] for ex in examples])
        if self.prefix_sharing != "none":
            output.update(
                prefix_sharing.pack_pairs(examples, self.prefix_sharing, output["input_ids"].shape[1])
            )
        return output


class SelSkillDPOTrainer(DPOTrainer):
    """DPOTrainer on pre-tokenized pair rows with per-token loss masks (columns: TOKEN_COLUMNS + kind).

    Logs TRL's metrics over the whole batch plus `<kind>/rewards/{chosen,rejected,margins,accuracies}`
    and `<kind>/loss` (sigmoid loss) per pair kind. `args.train_prefix_sharing` (pair | branch;
    absent = none) runs each batch as prefix trees, with the same loss; branch also orders the
    training rows by branch point (BranchPointSampler) so that a batch holds pairs that share one.
    """

    def __init__(self, model, ref_model=None, args=None, data_collator=None, processing_class=None, **kwargs):
        self.prefix_sharing = getattr(args, "train_prefix_sharing", "none")
        if self.prefix_sharing not in prefix_sharing.MODES:
            raise ValueError(
                f"train_prefix_sharing must be one of {', '.join(prefix_sharing.MODES)}; got {self.prefix_sharing!r}"
            )
        if getattr(args, "bf16", False) and getattr(args, "mixed_precision", "bf16") != "bf16":
            # the recipe's train section, built without this machine's bf16 check: it would train in fp32
            raise ValueError(
                "the trainer's args have bf16 on but were built without it (the recipe's train section): "
                "train with selskill.train.args.training_args(run, policy, train)"
            )
        if data_collator is None:
            if processing_class is None:
                raise ValueError(
                    "SelSkillDPOTrainer needs the tokenizer as processing_class (its pad token pads the batches)"
                )
            tok = getattr(processing_class, "tokenizer", processing_class)
            pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
            if pad_id is None:
                raise ValueError("the tokenizer has neither a pad nor an eos token: set tokenizer.pad_token")
            data_collator = MaskedPreferenceCollator(
                pad_token_id=pad_id,
                max_length=args.max_length if args is not None else None,
                pad_to_multiple_of=args.pad_to_multiple_of if args is not None else None,
                prefix_sharing=self.prefix_sharing,
            )
        self._capture: dict[str, list[torch.Tensor]] | None = None
        super().__init__(
            model,
            ref_model=ref_model,
            args=args,
            data_collator=data_collator,
            processing_class=processing_class,
            **kwargs,
        )
        self._enable_packing(self.model)  # an unsupported model fails here, before any step
        self._hooks = [self.model.register_forward_hook(self._capture_hook("policy"))]
        if self.ref_model is not None:
            ref = getattr(self.ref_model, "module", self.ref_model)  # DeepSpeed engine / DDP wrapper
            self._hooks.append(ref.register_forward_hook(self._capture_hook("ref")))

    # --- the three overrides the mask needs (docs/design.md, "DPO with a per-token loss mask") ---------

    def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
        """Rows are already tokenized and fitted (selskill.train.pairs): check, then pass through."""
        names = dataset.column_names
        if names is None:  # IterableDataset without known features
            names = list(next(iter(dataset)).keys())
        missing = [c for c in TOKEN_COLUMNS if c not in names]
        if missing:
            raise ValueError(
                f"the {dataset_name} dataset lacks columns {missing}: SelSkillDPOTrainer trains pre-tokenized pair rows "
                f"with loss masks; build them from pair shards with selskill.train.pairs.build_examples"
            )
        return dataset

    def _set_signature_columns_if_needed(self):
        super()._set_signature_columns_if_needed()
        self._signature_columns = list(self._signature_columns) + [
            c for c in EXTRA_COLUMNS if c not in self._signature_columns
        ]

    # (the collator above is the third)

    # --- prefix sharing ------------------------------------------------------------------------------------

    def _enable_packing(self, model) -> None:
        """Let the policy and the reference run packed batches (on first use: TRL builds and wraps them)."""
        if self.prefix_sharing == "none":
            return
        from accelerate.utils import is_peft_model

        for m in (model, getattr(self, "ref_model", None)):
            if m is None:
                continue
            m = self.accelerator.unwrap_model(m)  # DDP, DeepSpeed engines
            prefix_sharing.enable(m.get_base_model() if is_peft_model(m) else m, self.prefix_sharing)

    def _get_train_sampler(self, train_dataset=None):
        dataset = self.train_dataset if train_dataset is None else train_dataset
        if self.prefix_sharing != "branch" or dataset is None:
            return super()._get_train_sampler(train_dataset)
        groups = prefix_sharing.prompt_groups(dataset["prompt_ids"])
        return prefix_sharing.BranchPointSampler(groups, seed=self.args.seed)

    # --- per-kind metrics --------------------------------------------------------------------------------

    def _capture_hook(self, name: str):
        def hook(module, args, output):
            if self._capture is not None and getattr(output, "log_probs", None) is not None:
                self._capture[name].append(output.log_probs.detach().sum(dim=1))

        return hook

    def compute_ref_log_probs(self, model, inputs):
        self._enable_packing(model)
        inputs = {k: v for k, v in inputs.items() if k != "pair_kind"}
        return super().compute_ref_log_probs(model, inputs)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        self._enable_packing(model)
        kinds = inputs.pop("pair_kind", None)
        per_kind = kinds is not None and self.ld_alpha is None and self.f_divergence_type == "reverse_kl"
        self._capture = {"policy": [], "ref": []} if per_kind else None
        try:
            result = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            if model.training:
                self._refuse_nonfinite(result[0] if return_outputs else result)
            if per_kind:
                self._log_per_kind(kinds, inputs)
        finally:
            self._capture = None
        return result

    def _refuse_nonfinite(self, loss: torch.Tensor) -> None:
        """Stop at the first training loss that is nan or inf, before its gradients reach the weights.

        The Trainer's `logging_nan_inf_filter` would replace it by the running mean and train on, so
        the logged losses look fine while every weight turns nan. The check costs the one device sync
        that filter already makes each step. Under a multi-process launch a nan on one rank ends that
        process, and the launcher ends the others.
        """
        if not bool(torch.isfinite(loss.detach()).all()):
            raise TrainDiverged(
                f"train: the loss is {loss.detach().float().mean().item()} at step {self.state.global_step + 1} "
                f"(beta {self.beta}, learning_rate {self.args.learning_rate}): the training diverged; {DIVERGED_FIX}"
            )

    def _log_per_kind(self, kinds: torch.Tensor, inputs: dict) -> None:
        policy, ref = self._capture["policy"], self._capture["ref"]
        if not policy:
            return
        logps = policy[0]
        if "ref_chosen_logps" in inputs:
            ref_logps = torch.cat([inputs["ref_chosen_logps"], inputs["ref_rejected_logps"]]).to(logps)
        elif ref:
            ref_logps = ref[0]
        elif len(policy) > 1:  # PEFT: the reference is the policy with its adapter disabled
            ref_logps = policy[1]
        else:
            return
        chosen, rejected = (self.beta * (logps - ref_logps)).chunk(2)
        gathered = self.accelerator.gather(torch.stack([chosen, rejected, kinds.to(chosen).float()], dim=1))
        chosen, rejected, kind_ids = gathered.float().unbind(1)
        onehot = (
            torch.nn.functional.one_hot(kind_ids.long(), num_classes=len(PAIR_KINDS)).float().T
        )  # (kinds, N)
        margins = chosen - rejected
        per_pair = torch.stack(
            [
                torch.ones_like(margins),
                chosen,
                rejected,
                margins,
                (margins > 0).float(),
                -torch.nn.functional.logsigmoid(margins),
            ]
        )
        sums = (onehot @ per_pair.T).tolist()  # (kinds, 6), one device sync for all per-kind metrics
        mode = "train" if self.model.training else "eval"
        names = ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies", "loss")
        for kind, (count, *totals) in zip(PAIR_KINDS, sums, strict=True):
            if count == 0:
                continue
            for name, total in zip(names, totals, strict=True):
                if name == "loss" and self.loss_types != ["sigmoid"]:
                    continue  # -logsigmoid(margin) is the pair's loss only for the sigmoid (DPO) loss
                self._metrics[mode][f"{kind}/{name}"].append(total / count)
