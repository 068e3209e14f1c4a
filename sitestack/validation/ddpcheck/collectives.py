"""The collectives check: allreduce, allgather and broadcast give exactly the right values."""

from __future__ import annotations

from .state import Run
from .verdicts import FAILED, PASSED, rank_fault


def collectives(run: Run) -> None:
    """The collectives check: allreduce, allgather and broadcast of known values, exact on every rank."""
    torch, dist, n, rank = run.torch, run.dist, run.info.world_size, run.info.rank
    dev = run.torch_device()
    errors = []
    value = float(rank + 1) + (1.0 if rank_fault(run.env, "allreduce", rank) else 0.0)
    t = torch.full((4096,), value, dtype=torch.float32, device=dev)
    dist.all_reduce(t)
    want = n * (n + 1) / 2
    got = t.cpu()
    if not bool((got == want).all()):
        wrong = got[got != want]
        errors.append(f"allreduce(sum) gave {float(wrong[0]):g}, expected {want:g} on {int(wrong.numel())} of {got.numel()} elements")
    chunk = torch.arange(8, dtype=torch.float32, device=dev) + 8 * rank
    parts = [torch.empty_like(chunk) for _ in range(n)]
    dist.all_gather(parts, chunk)
    gathered = torch.cat([p.cpu() for p in parts])
    if not torch.equal(gathered, torch.arange(8 * n, dtype=torch.float32)):
        errors.append(f"allgather gave {gathered[:16].tolist()}..., expected 0..{8 * n - 1}")
    root = n - 1
    b = torch.full((1024,), 42.0 + root if rank == root else -1.0, device=dev)
    dist.broadcast(b, src=root)
    if not bool((b.cpu() == 42.0 + root).all()):
        errors.append(f"broadcast from rank {root} gave {float(b.cpu()[0]):g}, expected {42.0 + root:g}")
    reports = run.all_gather(errors)
    bad = [(i, e) for i, errs in enumerate(reports) for e in errs]
    if bad:
        ranks = sorted({i for i, _ in bad})
        run.set("collectives", FAILED, f"{bad[0][1]} (wrong on rank{'s' if len(ranks) > 1 else ''} "
                f"{', '.join(map(str, ranks))})", errors=[f"rank {i}: {e}" for i, e in bad])
    else:
        run.set("collectives", PASSED, f"allreduce, allgather and broadcast exact on all {n} ranks")
