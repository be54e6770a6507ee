"""ge2jit.torch layers under torch.nn.parallel.DistributedDataParallel: their parameters are
ordinary tensors, so DDP's gradient hooks and buckets see ge2jit's gradients as any layer's.
One process (world size 1, NCCL) on one GPU: the all-reduced gradients equal the plain
model's and training stays in step with it."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu
dist = pytest.importorskip("torch.distributed")


@pytest.fixture
def group(tmp_path):
    if not dist.is_available() or not dist.is_nccl_available():
        pytest.skip("needs torch.distributed with NCCL")
    dist.init_process_group("nccl", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1, device_id=torch.device("cuda", 0))
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("bucket_view", [False, True])
def test_ddp_of_ge2jit_layers_matches_the_plain_model(group, bucket_view):
    import ge2jit.torch as gt

    torch.manual_seed(7)
    model = torch.nn.Sequential(gt.Linear(64, 96, act="relu"),
                                gt.MLP([96, 256, 32], act="gelu_tanh")).cuda()
    plain = copy.deepcopy(model)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0],
                                                    gradient_as_bucket_view=bucket_view,
                                                    bucket_cap_mb=1)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    opt_plain = torch.optim.SGD(plain.parameters(), lr=0.05)
    for step in range(3):
        x = torch.randn(40, 64, device="cuda")
        target = torch.randn(40, 32, device="cuda")
        for m, o in ((ddp, opt), (plain, opt_plain)):
            o.zero_grad()
            loss = torch.nn.functional.mse_loss(m(x), target)
            loss.backward()
        for p, q in zip(model.parameters(), plain.parameters()):
            assert p.grad is not None and torch.isfinite(p.grad).all()
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-6, atol=1e-7,
                                       msg=f"step {step}")
        opt.step()
        opt_plain.step()
    for p, q in zip(model.parameters(), plain.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
