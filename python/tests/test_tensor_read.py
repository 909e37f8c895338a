"""Tensor arguments read the same through torch's DLPack exchange API (the
fast path, torch 2.10+) as through their Python attributes (the path every
torch has): same dtype, device, data pointer, extent, shape and strides,
or the same exception; and nothing is remembered between calls."""

import pytest
import torch

from dsv4_kvcache import _native

HAS_EXCHANGE = hasattr(torch.Tensor, "__dlpack_c_exchange_api__")


def both(t):
    """(exchange path, attribute path): the facts, or (type, message)."""
    out = []
    for exchange in (True, False):
        try:
            out.append(_native._read_tensor(t, exchange))
        except Exception as e:  # noqa: BLE001 - compared below, type included
            out.append((type(e), str(e)))
    return out


class Sub(torch.Tensor):
    pass


def tensors(device):
    big = torch.arange(4 * 640, dtype=torch.float32, device=device).view(4, 640)
    bf = big.bfloat16()
    yield "contiguous bf16", torch.zeros(2, 512, dtype=torch.bfloat16, device=device)
    for dt in (torch.float32, torch.bfloat16, torch.uint8, torch.float8_e4m3fn, torch.int32, torch.int64):
        yield f"{dt}", torch.zeros(3, 5, device=device).to(dt)
    yield "row view of size 1", bf[1:2, :512]
    yield "offset view", bf[2:, 3:515]
    yield "size-1 dim, odd stride", big[::4][:1]
    yield "stride 0", torch.zeros(1, 512, device=device).expand(3, 512)
    yield "transposed", big.t()
    yield "4-D", torch.zeros(2, 3, 4, 5, device=device)
    yield "5-D", torch.zeros(1, 2, 1, 2, 1, device=device)
    yield "scalar", torch.tensor(1.5, device=device)
    yield "empty rows", bf[4:]
    yield "empty columns", bf[:, :0]
    yield "set_ into storage", torch.zeros(0, device=device).set_(big.untyped_storage(), 6, (2, 2), (3, 1))
    yield "requires grad", torch.zeros(2, 3, device=device, requires_grad=True)
    yield "non-leaf", torch.zeros(2, 3, device=device, requires_grad=True) * 2
    yield "parameter", torch.nn.Parameter(torch.zeros(2, 3, device=device))
    yield "subclass", torch.zeros(2, 3, device=device).as_subclass(Sub)
    with torch.inference_mode():
        yield "inference", torch.zeros(2, 3, device=device)
    yield "float16", torch.zeros(2, device=device, dtype=torch.float16)
    yield "bool", torch.zeros(2, device=device, dtype=torch.bool)
    yield "complex", torch.zeros(2, device=device, dtype=torch.complex64)
    yield "float8_e5m2", torch.zeros(2, device=device, dtype=torch.float8_e5m2)
    yield "meta", torch.zeros(2, 3, device="meta")
    yield "sparse", torch.zeros(2, 3, device=device).to_sparse()
    yield "not a tensor", [1, 2]


def check(device):
    for name, t in tensors(device):
        fast, attrs = both(t)
        assert fast == attrs, f"{name}: exchange {fast} != attributes {attrs}"


def test_exchange_in_use_where_torch_has_it():
    assert _native._reads_by_exchange() == HAS_EXCHANGE


def test_same_facts_cpu():
    check("cpu")


def test_same_facts_cuda():
    if not torch.cuda.is_available():
        pytest.skip("no GPU: torch.cuda.is_available() is False")
    check("cuda")


@pytest.mark.parametrize("exchange", [True, False])
def test_nothing_remembered(exchange):
    """The same object read again after resize_ / set_ shows its new facts."""
    t = torch.zeros(4, 8)
    a = _native._read_tensor(t, exchange)
    t.resize_(2, 3)
    b = _native._read_tensor(t, exchange)
    assert b[4:] == ([2, 3], [3, 1]) and b[2] == t.data_ptr()
    other = torch.zeros(64)
    t.set_(other.untyped_storage(), 4, (3, 5), (1, 3))
    c = _native._read_tensor(t, exchange)
    assert c[2] == other.data_ptr() + 16 and c[4:] == ([3, 5], [1, 3]), (a, b, c)
