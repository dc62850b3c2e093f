"""The checks every module checker runs (tour page 8): nothing built in forward or held
where nn.Module cannot see it, dropout off in eval mode, a gradient for every parameter."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from aiayn.tour.report import FoundBugError, close, eval_mode

PAGE = "08-residual-layernorm.md"

# Modules that behave differently in training and in eval mode, which only eval() on a
# module that holds them can switch.
_MODE_DEPENDENT = (
    nn.Dropout,
    nn.Dropout1d,
    nn.Dropout2d,
    nn.Dropout3d,
    nn.AlphaDropout,
    nn.FeatureAlphaDropout,
    nn.modules.batchnorm._NormBase,  # batch and instance norm: batch statistics in training
)
_MODULE_INTERNALS = frozenset(vars(nn.Module()))  # _parameters, _modules, hooks, ...
# Activations that are not max(0, x): smooth ones, and those with a slope below 0.
_NOT_RELU = frozenset(
    {"gelu", "silu", "elu", "selu", "celu", "softplus", "mish", "leaky_relu", "prelu"}
    | {"rrelu", "tanh", "sigmoid", "erf", "hardswish", "hardtanh", "logsigmoid", "softsign"}
    | {"relu6"}
)


class _Activations(TorchFunctionMode):
    """While active, records the name of every activation in ``_NOT_RELU`` that runs."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        name = str(getattr(func, "__name__", "")).strip("_")
        if name in _NOT_RELU and name not in self.seen:
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


def activations_not_relu(call: Callable[[], object]) -> list[str]:
    """The names of the activations other than ReLU (GELU, SiLU, tanh, ...) that run in
    ``call()``, in the order they first run."""
    with _Activations() as watch:
        call()
    return watch.seen


@contextmanager
def modules_called() -> Iterator[list[nn.Module]]:
    """Every nn.Module whose forward runs inside the block, in call order."""
    seen: list[nn.Module] = []
    handle = nn.modules.module.register_module_forward_pre_hook(lambda m, _: seen.append(m))
    try:
        yield seen
    finally:
        handle.remove()


def _harmless(m: nn.Module) -> bool:
    """True for a module that may as well be made on every call: no parameters, no
    buffers, nothing that eval() would switch (an nn.ReLU(), an nn.Softmax(dim=-1))."""
    return (
        not any(True for _ in m.parameters())
        and not any(True for _ in m.buffers())
        and not any(isinstance(sub, _MODE_DEPENDENT) for sub in m.modules())
    )


def _holds(value: object, target: nn.Module, depth: int = 2) -> bool:
    """True when ``value`` is a plain list, tuple, set or dict holding ``target``."""
    if isinstance(value, dict):
        value = list(value.values())
    if not isinstance(value, (list, tuple, set)) or depth == 0:
        return False
    return any(item is target or _holds(item, target, depth - 1) for item in value)


def _plain_container(module: nn.Module, stranger: nn.Module) -> tuple[str, str] | None:
    """Where ``module`` (or a submodule) keeps ``stranger`` in a plain Python container:
    (``self.proj``, ``list``), or None."""
    for prefix, m in module.named_modules():
        for name, value in vars(m).items():
            if name not in _MODULE_INTERNALS and _holds(value, stranger):
                return f"self.{prefix + '.' if prefix else ''}{name}", type(value).__name__
    return None


def _kinds(modules: Iterable[nn.Module]) -> str:
    return ", ".join(sorted({type(m).__name__ for m in modules}))


def _parameters(modules: list[nn.Module]) -> int:
    """How many parameters ``modules`` hold, each counted once (a Sequential's too)."""
    return sum(p.numel() for m in modules for p in m.parameters(recurse=False))


def check_no_modules_built_in_forward(module: nn.Module, call: Callable[[], object]) -> None:
    """Every module that runs during ``call()`` must belong to ``module``, unless it is
    harmless (no parameters or buffers, nothing eval() switches: an ``nn.ReLU()`` made in
    forward is fine). Names, in this order: one held in a plain list, tuple or dict
    (``modules_in_plain_list``: nn.Module registers none of them), one with parameters or
    buffers built inside ``forward`` (new weights on every call that no optimizer sees and
    no checkpoint saves), and a dropout (or batch norm) built there, which eval() never
    reaches (both ``module_built_in_forward``)."""
    own = {id(m) for m in module.modules()}
    with modules_called() as seen:
        call()
    strangers = [m for m in seen if id(m) not in own and not _harmless(m)]
    if not strangers:
        return
    listed = [(m, held) for m in strangers if (held := _plain_container(module, m)) is not None]
    if listed:
        (where, container), params = listed[0][1], _parameters([m for m, _ in listed])
        lost = "eval() does not reach them"
        if params:
            lost = (
                f"their {params} parameters are not in .parameters(), so the optimizer never "
                "trains them, .to(device) does not move them, state_dict() does not save "
                "them, and " + lost
            )
        raise FoundBugError(
            "modules_in_plain_list",
            f"{_kinds(m for m, _ in listed)} held in a plain Python {container}, {where}: "
            "nn.Module registers the modules assigned to it as attributes or held in an "
            f"nn.ModuleList (nn.ModuleDict), not those of a {container}. So {lost}. Use "
            "nn.ModuleList (nn.ModuleDict for a dict).",
            PAGE,
        )
    kinds, params = _kinds(strangers), _parameters(strangers)
    if params or any(True for m in strangers for _ in m.buffers(recurse=False)):
        raise FoundBugError(
            "module_built_in_forward",
            f"{kinds} built inside forward: a new one ({params} parameters) on every call, "
            "not in .parameters(), so the optimizer never trains its weights and "
            "state_dict() never saves them. Build it in __init__ and keep it as an "
            "attribute.",
            PAGE,
        )
    raise FoundBugError(
        "module_built_in_forward",
        f"{kinds} built inside forward: a new one on every call, always in training mode, "
        "since eval() switches only the modules the model holds. So it keeps dropping "
        "values when the model is evaluated and translates. Build it in __init__ and keep "
        "it as an attribute (self.dropout = nn.Dropout(p)), or call "
        "F.dropout(x, p, training=self.training).",
        PAGE,
    )


def check_deterministic(run: Callable[[], Tensor]) -> None:
    """``run()`` (the module in eval mode) must give the same output twice: dropout off."""
    if not close(run(), run(), atol=0):
        raise FoundBugError(
            "dropout_in_eval",
            "two calls in eval mode give different outputs: dropout is still on. "
            "Use nn.Dropout modules (or F.dropout(x, p, training=self.training)).",
            PAGE,
        )


def check_gradients(module: nn.Module, loss: Callable[[], Tensor], what: str) -> None:
    """A backward of ``loss()`` (``module`` in eval mode, with autograd) must reach every
    parameter of ``module`` that requires one: a weight that gets no gradient is one the
    module defines but never uses (``unused_parameters``)."""
    try:
        with eval_mode(module):
            module.zero_grad()
            loss().backward()
            idle = [n for n, p in module.named_parameters() if p.requires_grad and p.grad is None]
    finally:
        module.zero_grad()  # the learner's optimizer must not step on the checker's gradients
    if idle:
        raise FoundBugError(
            "unused_parameters",
            f"no gradient reaches {', '.join(idle[:4])}: a weight the {what} defines but "
            "never uses",
            PAGE,
        )
