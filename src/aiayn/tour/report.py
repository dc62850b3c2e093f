"""What a checker of :mod:`aiayn.tour` hands back: the checks that passed and the first
bug found, named, with what was measured and the tour page that explains it."""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

TOUR = "docs/tour/"

Check = tuple[str, Callable[[], object]]  # a check's name and the check (its result unused)


class FoundBugError(Exception):
    """Raised inside a check: ``bug`` is a short name (``"scale_after_softmax"``),
    ``message`` says what was measured and why it is wrong, ``page`` the tour page."""

    def __init__(self, bug: str, message: str, page: str | None = None):
        super().__init__(message)
        self.bug, self.message, self.page = bug, message, page


class NotCheckedError(Exception):
    """Raised inside a check that could not measure what it checks (a scale fitted against
    projections it cannot find, say): the check is reported as not checked, never as ok,
    and the checks after it still run. ``why`` says what could not be measured."""

    def __init__(self, why: str):
        super().__init__(why)
        self.why = why


@dataclass
class Report:
    """The result of one checker. True when every check passed.

    ``passed`` names the checks that passed, in order; ``failed`` the check that found a
    bug (None if none did), ``bug`` that bug's short name, ``message`` the explanation and
    ``page`` the tour page about it. Checks after the first failure are not run: fix one
    bug at a time. ``unchecked`` holds (name, why) for each check that could not measure
    what it checks: such a check neither passed nor failed. ``ok`` means no bug was found;
    ``complete`` that, and that every check ran.
    """

    subject: str
    passed: list[str] = field(default_factory=list)
    failed: str | None = None
    bug: str | None = None
    message: str = ""
    page: str | None = None
    unchecked: list[tuple[str, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.failed is None

    @property
    def complete(self) -> bool:
        """True when every check ran and passed (none of them left not checked)."""
        return self.ok and not self.unchecked

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        if self.complete:
            lines = [f"{self.subject}: all {len(self.passed)} checks passed"]
        elif self.ok:
            lines = [
                f"{self.subject}: no bug found, but NOT ALL CHECKED: {len(self.passed)} checks "
                f"passed, {len(self.unchecked)} could not be run"
            ]
        else:
            number = len(self.passed) + len(self.unchecked) + 1
            lines = [
                f"{self.subject}: FAILED check {number}, {self.failed!r}",
                f"  bug: {(self.bug or '').replace('_', ' ')}",
            ]
            for paragraph in self.message.splitlines():
                lines += textwrap.wrap(paragraph, 86, initial_indent="  ", subsequent_indent="  ")
            if self.page:
                lines.append(f"  see {TOUR}{self.page}")
        lines += [f"  ok  {name}" for name in self.passed]
        for name, why in self.unchecked:
            lines += textwrap.wrap(
                f"not checked: {name}: {why}",
                86,
                initial_indent="  ??  ",
                subsequent_indent="      ",
            )
        return "\n".join(lines)


# Why a learner's multi-head attention may raise "must match" (with attention.K_T).
HEAD_SPLIT = (
    "A head split whose transpose(1, 2) or view() result is thrown away (on a line of its "
    "own, it leaves t as it was) keeps the positions where the heads belong; self-attention "
    "without a mask can hide this when the shapes happen to fit."
)


def run_checks(subject: str, checks: Sequence[Check], page: str, shape_hint: str = "") -> Report:
    """Run ``checks`` (name, function) in order until one raises :class:`FoundBugError`. A
    check that raises :class:`NotCheckedError` is listed as not checked, and the next one
    runs. Any other exception comes from the learner's code and is reported as the bug
    ``raises``. ``page`` is the tour page of the piece checked: a failure that names no
    page of its own (the learner's code raised, returned no tensor, a wrong shape) points
    there. ``shape_hint`` follows an error of two shapes that do not fit: this checker's
    likely causes."""
    report = Report(subject)
    for name, check in checks:
        try:
            check()
        except FoundBugError as found:
            report.failed, report.bug, report.page = name, found.bug, found.page or page
            report.message = found.message
            return report
        except NotCheckedError as missed:
            report.unchecked.append((name, missed.why))
            continue
        except Exception as error:  # the learner's function raised: say where and what
            report.failed, report.bug, report.page = name, "raises", page
            report.message = f"calling it raised {type(error).__name__}: {error}"
            if shape_hint and ("size of tensor" in str(error) or "must match" in str(error)):
                report.message += f"\n(Two shapes that do not fit. {shape_hint})"
            if "view size is not compatible" in str(error):
                report.message += (
                    "\n(.view() on a non-contiguous tensor, a transposed one say, which view "
                    "cannot reshape in place: use .reshape(...) or .contiguous().view(...).)"
                )
            return report
        report.passed.append(name)
    return report


def name_of(thing: object) -> str:
    """How a learner's function or module is named in a report."""
    if isinstance(thing, nn.Module):
        return type(thing).__name__
    return getattr(thing, "__qualname__", None) or type(thing).__name__


def first_tensor(result: object, what: str) -> Tensor:
    """The output tensor of a call that returns a tensor or a tuple starting with one."""
    if isinstance(result, (tuple, list)) and result and isinstance(result[0], Tensor):
        return result[0]
    if isinstance(result, Tensor):
        return result
    raise FoundBugError("wrong_return", f"{what} returned {type(result).__name__}, not a tensor")


def expect_shape(t: Tensor, shape: tuple[int, ...], what: str, page: str | None = None) -> None:
    if tuple(t.shape) != shape:
        raise FoundBugError(
            "wrong_shape", f"{what} has shape {list(t.shape)}, expected {list(shape)}", page
        )


# Why a layer's output holds NaN when its masks hide no query's every key.
INVERTED_MASK = (
    " No query has all its keys masked here, so a mask is likely read the other way round: "
    "aiayn's masks are True where a position may be attended, while masked_fill(mask, -inf) "
    "and nn.MultiheadAttention's key_padding_mask and attn_mask take True as masked. Pass "
    "~mask (or masked_fill(~mask, float('-inf')))."
)


def expect_finite(t: Tensor, what: str, why: str = "", page: str | None = None) -> None:
    """FoundBugError ``nan_output`` (``why`` appended) unless ``t`` is finite."""
    bad = int((~torch.isfinite(t)).sum()) if t.is_floating_point() else 0
    if bad:
        raise FoundBugError(
            "nan_output",
            f"{what} holds {bad} NaN or infinite value(s) of {t.numel()} for a finite input.{why}",
            page,
        )


@contextmanager
def eval_mode(module: nn.Module) -> Iterator[nn.Module]:
    """``module`` in eval mode (dropout off); afterwards every submodule's mode is as it
    was (``train(mode)`` would set them all alike, and a learner may hold a part in eval
    mode on purpose, or one in training mode)."""
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        yield module
    finally:
        for m, training in modes:
            m.training = training


@contextmanager
def evaluating(module: nn.Module) -> Iterator[nn.Module]:
    """``module`` in eval mode and without autograd, each mode restored afterwards."""
    with eval_mode(module), torch.no_grad():
        yield module


def close(a: Tensor, b: Tensor, atol: float = 1e-5) -> bool:
    return a.shape == b.shape and torch.allclose(a.float(), b.float(), atol=atol, rtol=1e-4)


def not_a_module(thing: object, subject: str, page: str) -> Report | None:
    """A failed report when ``thing``, given to a module checker, is no nn.Module instance
    (a plain function, or the class itself), else None."""
    if isinstance(thing, nn.Module):
        return None
    if isinstance(thing, type) and issubclass(thing, nn.Module):
        said = f"{thing.__name__} is the class: pass an instance, {thing.__name__}(...)"
    else:
        said = (
            f"got {type(thing).__name__} {name_of(thing)!r}: the checker takes an instance of "
            "an nn.Module subclass, whose weights it can list and whose eval() it can call"
        )
    return Report(
        subject, failed="an nn.Module instance", bug="not_a_module", message=said, page=page
    )
