"""Gaps a mutation run found in model/projection.py and model/inputs.py: what the CPU
vendor check reads and what the model's input checks refuse (and take)."""

from __future__ import annotations

import pytest
import torch

from aiayn.errors import ModelInputError
from aiayn.model import projection
from aiayn.model.inputs import check_ids


def test_the_cpu_vendor_is_read_past_bytes_that_are_not_ascii(tmp_path):
    """/proc/cpuinfo may hold bytes that are not ASCII (a model name, a firmware string):
    the vendor_id line is still read, no decoding error."""
    info = tmp_path / "cpuinfo"
    info.write_bytes(
        b"processor\t: 0\nmodel name\t: Caf\xc3\xa9 \xff CPU\nvendor_id\t: AuthenticAMD\n"
    )
    assert projection.cpu_vendor(str(info)) == "AuthenticAMD"


@pytest.mark.parametrize(
    ("processor", "vendor"),
    [
        ("AMD64 Family 25 Model 33 Stepping 0, AuthenticAMD", "AuthenticAMD"),
        ("Intel64 Family 6 Model 158 Stepping 10, GenuineIntel", "GenuineIntel"),
        ("arm", ""),
        ("", ""),
    ],
)
def test_without_cpuinfo_the_vendor_comes_from_the_platform(
    tmp_path, monkeypatch, processor, vendor
):
    """Where there is no /proc/cpuinfo (not Linux) the vendor is read from
    platform.processor() (Windows names it there), "" where it names none."""
    monkeypatch.setattr(projection.platform, "processor", lambda: processor)
    assert projection.cpu_vendor(str(tmp_path / "absent")) == vendor


def test_check_ids_without_values_checks_shape_and_dtype_only():
    """``values=False`` (the decoder's later steps, the source it was given before) skips
    the range check, which would cost a device synchronisation; the shape and dtype are
    still checked."""
    outside = torch.tensor([[0, 5, 99], [-1, 2, 3]])
    check_ids("tgt_in", outside, vocab_size=10, max_len=8, values=False)
    with pytest.raises(ModelInputError, match="holds id -1, outside the vocabulary"):
        check_ids("tgt_in", outside, vocab_size=10, max_len=8)
    with pytest.raises(ModelInputError, match=r"must be torch\.long"):
        check_ids("tgt_in", outside.int(), vocab_size=10, max_len=8, values=False)


@pytest.mark.parametrize("values", [True, False])
def test_check_ids_takes_an_empty_batch(values):
    """Ids of no tokens hold no id outside the vocabulary: no error, with or without the
    range check (torch's min() of an empty tensor would raise)."""
    for shape in ((2, 0), (0, 3)):
        check_ids("src", torch.zeros(shape, dtype=torch.long), 10, 8, values=values)
