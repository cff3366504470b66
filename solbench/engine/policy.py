"""PolicyNets: the networks of one run, by role.

Roles (docs/architecture.md): "policy" (trained), "reference" (the starting model, for KL terms),
"old" (a slowly following copy: DiffusionNFT's old policy, AWM's slow copy), "ema" (EMA of the
policy, for evaluation) and "explore" (a low-precision copy of the rollout role, solbench.quant).

Copies are kept light. With LoRA (peft), every role but "explore" is the same transformer: the
policy is adapter "default", the old policy and the EMA are adapters "old" and "ema" on the same
layers, and the reference is the model with adapters disabled. A role is a thin view module whose
forward activates its adapter for the call, so only adapter weights are duplicated. With full
fine-tuning, old/ema/reference are frozen deep copies.

The explore copy is built from its source role (the rollout role: "old" for the DiffusionNFT
family, as Sol-RL's reference syncs the old adapter) by a factory the harness supplies
(solbench.quant.quantized_copy with the run's recipe), and ``sync_explore_copy`` refreshes it after
every update (the engine times it as phase "sync"). The factory and the sync get the source role as
a module: with LoRA, the shared transformer with that role's adapter active (quantized_copy and
sync_weights merge the active adapter on the fly), so no full-precision merged copy is ever held.

Full-precision rollouts (issue 40): with ``rollout_copy`` the rollout role also gets a merged copy,
as the reference samples its full-precision rollouts from an inference copy with the old policy's
LoRA merged (NVlabs/Sana train_scripts/sol_rl/train_flux1.py at 6926be6, ``sync_lora_to_inference``
at lines 834 and 1292). It is a plain transformer whose adapted layers hold W + scale * B @ A in the
base dtype and whose other parameters are the policy's own frozen tensors (so on FLUX it holds the
190 adapted 3072 x 3072 projections, 3.6 GB in bf16, not a third transformer); ``rollout_module``
gives it for the source role, and ``sync_explore_copy`` refreshes it after every update, one layer at
a time (phase "sync"). Without it (``model.rollout_copy: lora``, the CPU default: the embedded
world's results were made so, and there a merged copy samples only 1.03-1.07x faster,
benchmarks/lora_rollout.py) rollouts run through the LoRA role. Which one a run takes is decided by
solbench.train.rollout_copy (auto: by the doctor's memory model) and written to rollout.json.

``compile_mode`` compiles the repeated blocks of every sampling network (solbench.models.compile): the shared
transformer (every LoRA role), the rollout copy and the explore copy unless it is emulated (its fake
quantizer checks for NaN on the host, which a compiled graph would break at on every layer).
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager

import torch
from torch import nn

from solbench.config import FinetuneConfig
from solbench.errors import ConfigError

LORA_ADAPTERS = {"policy": "default", "old": "old", "ema": "ema"}
ROLES = ("policy", "reference", "old", "ema", "explore")


def _tuner_layers(model: nn.Module) -> list[nn.Module]:
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [m for m in model.modules() if isinstance(m, BaseTunerLayer)]


@contextmanager
def active_adapter(model: nn.Module, adapter: str | None, layers: list[nn.Module] | None = None) -> Iterator[None]:
    """Run ``model`` with only LoRA adapter ``adapter`` active (None: adapters off, the base model).

    Restores the previous active adapter and every LoRA parameter's requires_grad on exit. Only
    flags change, never weights, so an autograd graph built before the switch stays valid.
    ``layers``: the model's LoRA layers if the caller has them (saves a walk over every module).

    A layer already in the requested state is not switched (peft's set_adapter walks every
    adapter's parameters; it ran about 1,300 times per Sol-RL iteration, issue 17).
    """
    layers = _tuner_layers(model) if layers is None else layers
    flags = [(p, p.requires_grad) for m in layers for p in m.parameters()]
    saved = [(m, list(m.active_adapters), m.disable_adapters) for m in layers]
    try:
        for m, active, disabled in saved:
            if adapter is None:
                if not disabled:
                    m.enable_adapters(False)
            else:
                if disabled:
                    m.enable_adapters(True)
                if active != [adapter]:
                    m.set_adapter(adapter, inference_mode=True)
        yield
    finally:
        for m, active, disabled in saved:
            if list(m.active_adapters) != active:
                m.set_adapter(active)
            if m.disable_adapters != disabled:
                m.enable_adapters(not disabled)
        for p, flag in flags:
            if p.requires_grad != flag:
                p.requires_grad_(flag)


class AdapterView(nn.Module):
    """A role of a LoRA model: the shared transformer run with one adapter active (or none).

    The view owns no parameters; attribute lookups it cannot answer (``config``, ``dtype``, ...) and
    ``parameters()`` go to the shared model, so adapters see a transformer.
    """

    def __init__(self, model: nn.Module, adapter: str | None) -> None:
        super().__init__()
        object.__setattr__(self, "_shared", model)  # not registered: the policy owns it
        object.__setattr__(self, "_layers", None)  # the shared model's LoRA layers, found on first use
        self.adapter = adapter

    def forward(self, *args, **kwargs):
        if self._layers is None:
            object.__setattr__(self, "_layers", _tuner_layers(self._shared))
        with active_adapter(self._shared, self.adapter, self._layers):
            return self._shared(*args, **kwargs)

    def parameters(self, recurse: bool = True):
        return self._shared.parameters(recurse)

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(object.__getattribute__(self, "_shared"), name)


class PolicyNets(Mapping):
    """Networks by role for one run; a read-only Mapping the engine looks roles up in.

    Args:
        transformer: the adapter's denoiser (LoRA is injected in place; full mode trains it).
        finetune: LoRA rank/alpha/targets or full fine-tuning, and the EMA decay.
        roles: the roles needed beyond "policy" and "ema" (a method's ``nets``).
        explore_source: the role the explore copy mirrors (a method's ``rollout_net``).
        explore_factory: module -> its low-precision copy (e.g. solbench.quant.quantized_copy).
        explore_sync: (explore copy, module with the new weights) -> None, refreshing the copy.
        rollout_copy: keep a merged copy of ``explore_source`` for its deterministic rollouts (LoRA only).
        compile_mode: torch.compile mode of the sampling networks' blocks (solbench.models.compile); None: eager.
    """

    def __init__(self, transformer: nn.Module, finetune: FinetuneConfig, roles: Iterable[str] = (), *,
                 explore_source: str = "policy",
                 explore_factory: Callable[[nn.Module], nn.Module] | None = None,
                 explore_sync: Callable[[nn.Module, nn.Module], None] | None = None,
                 rollout_copy: bool = False, compile_mode: str | None = None) -> None:
        roles = set(roles) | {"policy", "ema"}
        unknown = roles - set(ROLES)
        if unknown:
            raise ConfigError(f"unknown network roles {sorted(unknown)}; roles are {', '.join(ROLES)}")
        self.mode = finetune.mode
        self.ema_decay = finetune.ema_decay
        self.ema_updates = 0
        self.roles = roles
        self.explore_source = explore_source
        self._explore_sync = explore_sync
        self._nets: dict[str, nn.Module] = {}

        if finetune.mode == "lora":
            self._build_lora(transformer, finetune)
        elif finetune.mode == "full":
            self._build_full(transformer)
        else:
            raise ConfigError(f"finetune.mode must be 'lora' or 'full', got {finetune.mode!r}")

        if "explore" in roles:
            if explore_factory is None or explore_sync is None:
                raise ConfigError("role 'explore' needs an explore_factory and explore_sync (solbench.quant)")
            if explore_source not in self._nets:
                raise ConfigError(f"explore copy source role {explore_source!r} is not built (roles: {sorted(self._nets)})")
            # Built from the source role itself, its adapter merged on the fly: no full-precision merge
            # target is kept (on FLUX that was a third bf16 transformer, 24 GB per rank). Under no_grad:
            # TE's layers keep a second (columnwise, for the backward) copy of their quantized weight
            # when built with gradients enabled (FLUX: 13.1 GB instead of 6.6), and no copy is trained.
            with torch.no_grad(), self._explore_source_view() as source:
                self._nets["explore"] = explore_factory(source).requires_grad_(False)
        self.rollout_copy: nn.Module | None = None
        if rollout_copy and self.mode == "lora":
            if explore_source not in self._nets:
                raise ConfigError(f"rollout copy source role {explore_source!r} is not built (roles: {sorted(self._nets)})")
            self.rollout_copy = self._merged_module(share_frozen=True)
        self.compiled_blocks = self._compile(compile_mode)

    # -- construction ----------------------------------------------------------------------------
    def _build_lora(self, transformer: nn.Module, finetune: FinetuneConfig) -> None:
        from peft import LoraConfig, inject_adapter_in_model

        transformer.requires_grad_(False)
        # init: "gaussian" draws A ~ N(0, 1/r) (PEFT's init_lora_weights="gaussian", every reference's choice);
        # "kaiming" (and None here: the trainer resolves None to the model's default first) is PEFT's default
        inits = {"gaussian": "gaussian", "kaiming": True, None: True}
        if finetune.lora_init not in inits:
            raise ConfigError(f"finetune.lora_init must be gaussian or kaiming, got {finetune.lora_init!r}")
        lora = LoraConfig(r=finetune.lora_rank, lora_alpha=finetune.lora_alpha,
                          target_modules=list(finetune.lora_targets), init_lora_weights=inits[finetune.lora_init])
        adapters = [LORA_ADAPTERS[r] for r in ("policy", "old", "ema") if r in self.roles]
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Already found a `peft_config`")
            for name in adapters:
                transformer = inject_adapter_in_model(lora, transformer, adapter_name=name)
        if not _tuner_layers(transformer):
            raise ConfigError(f"finetune.lora_targets {finetune.lora_targets} match no layer of the transformer")
        # fp32 adapters on a bf16 (or fp16) base, as the reference's PeftModel makes them: peft's
        # injection gives each adapter its base layer's dtype, and only PeftModel.__init__ upcasts.
        # In bf16, AdamW's v * 0.999 rounds back to v, weight decay vanishes, and the EMA/old-policy
        # lerps and the gradient sums over micro-batches and ranks lose their small terms. Gradients
        # and the optimizer's moments follow the parameters' dtype; peft runs the adapter branch in it.
        from peft.tuners.tuners_utils import cast_adapter_dtype

        for name in adapters:
            cast_adapter_dtype(transformer, adapter_name=name)
        for m in _tuner_layers(transformer):
            m.set_adapter("default")  # trainable, every other adapter frozen
        self.policy = transformer
        self._nets["policy"] = transformer
        for role in ("old", "ema"):
            if role in self.roles:
                self._nets[role] = AdapterView(transformer, LORA_ADAPTERS[role])
        if "reference" in self.roles:
            self._nets["reference"] = AdapterView(transformer, None)
        with torch.no_grad():  # old and ema start equal to the policy
            for role in ("old", "ema"):
                if role in self.roles:
                    for dst, src in zip(self.trainable(role), self.trainable("policy"), strict=True):
                        dst.copy_(src)

    def _build_full(self, transformer: nn.Module) -> None:
        transformer.requires_grad_(True)
        self.policy = transformer
        self._nets["policy"] = transformer
        for role in ("reference", "old", "ema"):
            if role in self.roles:
                self._nets[role] = copy.deepcopy(transformer).requires_grad_(False)

    # -- Mapping -----------------------------------------------------------------------------------
    def __getitem__(self, role: str) -> nn.Module:
        try:
            return self._nets[role]
        except KeyError:
            raise ConfigError(f"no network for role {role!r}; this run has {', '.join(sorted(self._nets))}") from None

    def __contains__(self, role: object) -> bool:
        return role in self._nets

    def __iter__(self):
        return iter(self._nets)

    def __len__(self) -> int:
        return len(self._nets)

    # -- parameters --------------------------------------------------------------------------------
    def trainable(self, role: str = "policy") -> list[torch.Tensor]:
        """The tensors that differ between roles, aligned across roles (LoRA: adapter weights)."""
        if role not in ("policy", "old", "ema") or role not in self._nets:
            raise ConfigError(f"role {role!r} has no trainable copy in this run ({', '.join(sorted(self._nets))})")
        if self.mode == "full":
            return list(self._nets[role].parameters())
        adapter = LORA_ADAPTERS[role]
        params = []
        for m in _tuner_layers(self.policy):
            for holder in (m.lora_A, m.lora_B):
                params.extend(holder[adapter].parameters())
        return params

    def ema_step(self) -> None:
        """EMA of the policy after an optimizer step, with the reference's warm-up min(decay, (1+n)/(10+n)),
        n = this step's count from 1 (NVlabs/DiffusionNFT: global_step += 1, then ema.step(..., global_step))."""
        self.ema_updates += 1
        n = self.ema_updates
        decay = min(self.ema_decay, (1 + n) / (10 + n))
        with torch.no_grad():
            for ema, p in zip(self.trainable("ema"), self.trainable("policy"), strict=True):
                ema.lerp_(p.detach(), 1 - decay)

    # -- explore copy ---------------------------------------------------------------------------------
    def merged_state_dict(self, role: str) -> dict[str, torch.Tensor]:
        """The plain transformer state dict (no LoRA keys) of ``role`` with its adapter merged in."""
        if self.mode == "full":
            return {k: v.detach() for k, v in self._nets[role].state_dict().items()}
        adapter = LORA_ADAPTERS[role]
        state = {}
        for key, value in self.policy.state_dict().items():
            if "lora_" in key:
                continue
            state[key.replace(".base_layer.", ".")] = value.detach()
        names = {m: n for n, m in self.policy.named_modules()}
        for m in _tuner_layers(self.policy):
            key = f"{names[m]}.weight"
            state[key] = state[key] + m.get_delta_weight(adapter).to(state[key].dtype)
        return state

    @contextmanager
    def _explore_source_view(self) -> Iterator[nn.Module]:
        """The explore copy's source role as a module whose forward (and solbench.quant's merge, which
        follows the active adapters) is that role: LoRA switches the shared transformer's adapter."""
        if self.mode == "full":
            yield self._nets[self.explore_source]
            return
        with active_adapter(self.policy, LORA_ADAPTERS.get(self.explore_source)):
            yield self.policy

    def _merged_module(self, share_frozen: bool = False) -> nn.Module:
        """A new plain transformer holding the explore source's merged weights. ``share_frozen``: its
        unadapted parameters are the policy's own (frozen) tensors, so only the adapted layers are new
        (the rollout copy); otherwise a full copy (inspection and tests)."""
        with torch.no_grad(), self._explore_source_view() as source:
            if self.mode == "full":
                return copy.deepcopy(source).requires_grad_(False)
            from solbench.quant.model import _strip_adapters

            adapted = {id(p) for m in _tuner_layers(source) for p in m.parameters()}
            memo = {id(p): p for p in source.parameters() if share_frozen and id(p) not in adapted}
            merged = copy.deepcopy(source, memo)
            _strip_adapters(source, merged)
            return merged.requires_grad_(False).eval()

    def rollout_module(self, role: str) -> nn.Module:
        """The module deterministic rollouts of ``role`` sample through: the merged rollout copy for its
        source role when the run keeps one, else the role itself. (Stochastic rollouts keep the role:
        their per-step log-probs must equal the loss's recomputation through it, bit for bit on CPU.)"""
        if self.rollout_copy is not None and role == self.explore_source:
            return self.rollout_copy
        return self[role]

    @property
    def rollout_path(self) -> str:
        """What full-precision rollouts of the source role sample through: merged | lora | full."""
        return "full" if self.mode == "full" else ("merged" if self.rollout_copy is not None else "lora")

    def _compile(self, mode: str | None) -> int:
        """Compile the blocks of every sampling network (one module each, shared LoRA transformer once)."""
        if mode is None:
            return 0
        from solbench.models.compile import compile_blocks
        from solbench.quant.layers import QuantLinear

        modules = {id(self.policy): self.policy}
        for role, net in self._nets.items():
            net = object.__getattribute__(net, "_shared") if isinstance(net, AdapterView) else net
            if role == "explore" and any(isinstance(m, QuantLinear) for m in net.modules()):
                continue  # emulated: host-side NaN checks per layer (see the module docstring)
            modules.setdefault(id(net), net)
        if self.rollout_copy is not None:
            modules[id(self.rollout_copy)] = self.rollout_copy
        return sum(compile_blocks(m, mode) for m in modules.values())

    def sync_explore_copy(self) -> None:
        """Merge the source role's current weights and refresh the inference copies from them: the
        explore copy (explore_sync) and the merged rollout copy (adapted layers only, one at a time)."""
        if "explore" in self._nets:
            with torch.no_grad(), self._explore_source_view() as source:
                self._explore_sync(self._nets["explore"], source)
        if self.rollout_copy is not None:
            self._refresh_rollout_copy()

    @torch.no_grad()
    def _refresh_rollout_copy(self) -> None:
        from solbench.quant.model import _merged_adapter_weight

        names = {m: n for n, m in self.policy.named_modules()}
        with self._explore_source_view() as source:
            for layer in _tuner_layers(source):
                name = names[layer]
                self.rollout_copy.get_submodule(name).weight.copy_(_merged_adapter_weight(name, layer))

    # -- checkpointing ---------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"mode": self.mode, "ema_updates": self.ema_updates,
                "trainable": {role: [t.detach().cpu().clone() for t in self.trainable(role)]
                              for role in ("policy", "old", "ema") if role in self._nets}}

    def load_state_dict(self, state: Mapping) -> None:
        if state["mode"] != self.mode:
            raise ConfigError(f"checkpoint was trained with finetune.mode={state['mode']!r}, this run uses {self.mode!r}")
        with torch.no_grad():
            for role, tensors in state["trainable"].items():
                mine = self.trainable(role)
                if len(mine) != len(tensors):
                    raise ConfigError(f"checkpoint role {role!r} has {len(tensors)} tensors, this run {len(mine)}")
                for dst, src in zip(mine, tensors):
                    dst.copy_(src)
        self.ema_updates = int(state["ema_updates"])
        self.sync_explore_copy()
