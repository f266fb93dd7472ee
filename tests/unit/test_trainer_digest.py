"""replica_digest: equal values, equal digests; one changed weight, another digest (numpy, torch CPU and GPU)."""

from __future__ import annotations

import pytest
from gangwatch.producers.trainer.digest import device_checksum, replica_digest

from tests.helpers import need_module

pytestmark = pytest.mark.unit


def test_numpy_arrays():
    np = need_module("numpy")
    rng = np.random.default_rng(3)
    params = [rng.standard_normal((64, 32)).astype(np.float32), rng.standard_normal(32).astype(np.float32)]
    copies = [p.copy() for p in params]
    assert replica_digest(params) == replica_digest(copies)
    assert len(replica_digest(params)) == 16
    copies[0][17, 5] = np.nextafter(copies[0][17, 5], np.float32(np.inf))  # one weight, one ulp
    assert replica_digest(params) != replica_digest(copies)
    assert replica_digest(params) != replica_digest(params[::-1])  # order matters
    assert replica_digest([params[0]]) != replica_digest([params[0].reshape(32, 64)])  # and shape


def test_torch_cpu_tensors_of_any_dtype_and_parameters():
    torch = need_module("torch", "the `torch` extra")
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    twin = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    twin.load_state_dict(model.state_dict())
    assert replica_digest(model.parameters()) == replica_digest(twin.parameters())
    with torch.no_grad():
        twin[1].bias[0] += 1e-6
    assert replica_digest(model.parameters()) != replica_digest(twin.parameters())
    half = [p.detach().to(torch.bfloat16) for p in model.parameters()]  # no numpy dtype for bfloat16
    assert replica_digest(half) == replica_digest([h.clone() for h in half]) != replica_digest(model.parameters())


def test_the_device_checksum_sees_every_byte_wherever_it_is():
    torch = need_module("torch", "the `torch` extra")
    t = torch.randn(1000, 33)
    base = int(device_checksum(t))
    assert int(device_checksum(t.clone())) == base
    for i, j in [(0, 0), (999, 32), (517, 3)]:
        u = t.clone()
        u[i, j] = -u[i, j]  # flips one sign bit
        assert int(device_checksum(u)) != base
    swapped = t.clone()
    swapped[[0, 1]] = swapped[[1, 0]]
    assert int(device_checksum(swapped)) != base  # position matters, not only the multiset of bytes


@pytest.mark.gpu
def test_gpu_tensors_are_folded_on_the_gpu_and_agree_with_each_other():
    torch = need_module("torch", "the `torch` extra")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    params = [torch.randn(4096, 1024, device="cuda"), torch.randn(1024, device="cuda", dtype=torch.bfloat16)]
    copies = [p.clone() for p in params]
    assert replica_digest(params) == replica_digest(copies)
    assert int(device_checksum(params[0])) == int(device_checksum(params[0].cpu()))  # same fold on CPU
    copies[0][4095, 1023] += 1.0
    assert replica_digest(params) != replica_digest(copies)
