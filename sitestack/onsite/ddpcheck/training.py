"""The ddp and checkpoint checks: every rank builds the same model, a few DDP steps on synthetic data lower
the loss and leave the parameters identical everywhere; a checkpoint resumes to the same state."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
from typing import Any

from ..fileio import private_dir, write_atomic
from .checks import CHECKPOINT, DDP_CHECK
from .state import Run
from .verdicts import FAILED, PASSED, SKIPPED, rank_fault


def _model(run: Run, seed: int) -> Any:
    """The check's small model, built from ``seed`` on this rank's device."""
    torch = run.torch
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    return model.to(run.torch_device())


def _fingerprint(run: Run, module: Any) -> str:
    """A short digest of a model's state: equal on every rank when the parameters are."""
    digest = hashlib.sha256()
    for tensor in module.state_dict().values():
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def _batches(run: Run, steps: int) -> list[tuple[Any, Any]]:
    """``steps`` synthetic batches of a fixed regression, different on each rank."""
    torch = run.torch
    gen = torch.Generator().manual_seed(7)
    w_true = torch.randn(32, 1, generator=gen)
    data = torch.Generator().manual_seed(1000 + run.info.rank)
    dev = run.torch_device()
    out = []
    for _ in range(steps):
        x = torch.randn(64, 32, generator=data)
        y = torch.tanh(x @ w_true / 4) + 0.01 * torch.randn(64, 1, generator=data)
        out.append((x.to(dev), y.to(dev)))
    return out


def ddp(run: Run) -> tuple[Any, Any, list[tuple[Any, Any]]]:
    """The ddp check: same initial parameters, loss lowered, parameters identical after; (model, optimizer,
    spare batches) for the checkpoint check, also kept as ``run.trained``."""
    torch, dist = run.torch, run.dist
    from torch.nn.parallel import DistributedDataParallel as DDP  # type: ignore[import-not-found, unused-ignore]

    seed = 1234 + (1 if rank_fault(run.env, "seed", run.info.rank) else 0)
    model = _model(run, seed)
    prints = run.all_gather(_fingerprint(run, model))
    differ = [i for i, p in enumerate(prints) if p != prints[0]]
    problems = []
    if differ:
        problems.append(f"rank{'s' if len(differ) > 1 else ''} {', '.join(map(str, differ))} built different initial "
                        f"parameters than rank 0 (fingerprint {prints[differ[0]]} vs {prints[0]}); DDP would silently "
                        "overwrite them: check that every node runs the same torch and code")
    ids = [run.dev.index] if run.dev.kind != "cpu" and run.dev.index is not None else None
    ddp_model = DDP(model, device_ids=ids) if run.info.world_size > 1 else model
    optim = torch.optim.SGD(ddp_model.parameters(), lr=0.1, momentum=0.9)
    batches = _batches(run, run.args.steps + 2)
    losses = []
    for step, (x, y) in enumerate(batches[: run.args.steps], 1):
        run.note(f"step {step} forward", 2 * step)
        optim.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp_model(x), y)
        run.note(f"step {step} backward", 2 * step + 1)
        loss.backward()
        optim.step()
        mean = loss.detach().clone()
        if run.info.world_size > 1:
            dist.all_reduce(mean)
            mean /= run.info.world_size
        losses.append(float(mean.cpu()))
    after = run.all_gather(_fingerprint(run, model))
    differ_after = [i for i, p in enumerate(after) if p != after[0]]
    if differ_after:
        problems.append(f"parameters differ across ranks after {run.args.steps} DDP steps (ranks "
                        f"{', '.join(map(str, differ_after))} vs rank 0): gradients were not averaged")
    decreased = len(losses) >= 2 and losses[-1] < 0.9 * losses[0]
    if not decreased:
        problems.append(f"loss did not decrease: {losses[0]:.4g} -> {losses[-1]:.4g} over {len(losses)} steps")
    details = {"losses": losses, "initial_fingerprints": prints, "final_fingerprint": after[0]}
    if problems:
        run.set(DDP_CHECK.name, FAILED, problems[0], problems=problems, **details)
    else:
        run.set(DDP_CHECK.name, PASSED, f"loss {losses[0]:.4g} -> {losses[-1]:.4g} in {len(losses)} steps; parameters "
                f"identical on all {run.info.world_size} ranks ({after[0]})", **details)
    run.trained = (ddp_model, optim, batches[run.args.steps:])
    return run.trained


def checkpoint_check(run: Run) -> None:
    """The checkpoint check of the model the ddp check trained, skipped where that check did not finish."""
    if run.trained is None:
        run.set(CHECKPOINT.name, SKIPPED, "not run: the DDP check did not finish")
    else:
        checkpoint(run, *run.trained)


def _saved_and_loaded(run: Run, model: Any, optim: Any, path: str) -> Any:
    """Rank 0 saves the state at ``path``, every rank loads it: the state, or None when a rank could not
    write or read it (the check failed then, on every rank, naming it)."""
    torch, failed = run.torch, None
    if run.info.rank == 0:
        try:
            private_dir(os.path.dirname(path))  # never a link or a directory someone else planted in OUT
            buffer = io.BytesIO()  # a small model's state, written whole (fileio): never a part of one to load
            torch.save({"model": model.state_dict(), "optim": optim.state_dict()}, buffer)
            write_atomic(path, buffer.getvalue())
        except OSError as exc:
            failed = f"rank 0 on {run.host} could not write the checkpoint {path}: {_error(exc)}"
    if _told(run, failed, path):
        return None
    state = None
    try:  # a results directory not shared with this rank's node has no file here
        state = torch.load(path, map_location=run.torch_device(), weights_only=True)
    except (OSError, RuntimeError, EOFError) as exc:
        failed = f"rank {run.info.rank} on {run.host} could not read the checkpoint {path}: {_error(exc)}"
    if _told(run, failed, path) or state is None:
        _remove(run, path)
        return None
    return state


def _told(run: Run, failed: str | None, path: str) -> bool:
    """Every rank's ``failed`` gathered in place of a barrier: each rank learns at once that one could not
    write or read the checkpoint, and fails the check with the first; True then."""
    first = next(filter(None, run.all_gather(failed)), None)
    if first:
        run.set(CHECKPOINT.name, FAILED, first, path=path)
    return bool(first)


def _remove(run: Run, path: str) -> None:
    """Rank 0 removes the checkpoint and its directory, once every rank has read it (or failed to)."""
    if run.info.rank == 0:
        with contextlib.suppress(OSError):
            os.remove(path)
            os.rmdir(os.path.dirname(path))


def _error(exc: BaseException) -> str:
    return (exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)).splitlines()[0][:200]


def checkpoint(run: Run, ddp_model: Any, optim: Any, more: list[tuple[Any, Any]]) -> None:
    """The checkpoint check: save, resume into a fresh model and optimizer, the same state, and the same parameters after further steps."""
    torch = run.torch
    from torch.nn.parallel import DistributedDataParallel as DDP  # type: ignore[import-not-found, unused-ignore]

    model = ddp_model.module if hasattr(ddp_model, "module") else ddp_model
    path = os.path.join(run.args.out, "checkpoint", "ddp.pt")
    state = _saved_and_loaded(run, model, optim, path)
    if state is None:
        return
    fresh = _model(run, 99)
    fresh.load_state_dict(state["model"])
    fresh_ddp = DDP(fresh, device_ids=[run.dev.index] if run.dev.kind != "cpu" and run.dev.index is not None else None) \
        if run.info.world_size > 1 else fresh
    fresh_optim = torch.optim.SGD(fresh_ddp.parameters(), lr=0.1, momentum=0.9)
    fresh_optim.load_state_dict(state["optim"])
    problems = []
    if _fingerprint(run, fresh) != _fingerprint(run, model):
        problems.append("the resumed model differs from the saved one")
    for a, b in zip(optim.state_dict()["state"].values(), fresh_optim.state_dict()["state"].values()):
        if not torch.equal(a["momentum_buffer"].cpu(), b["momentum_buffer"].cpu()):
            problems.append("the resumed optimizer state (momentum) differs from the saved one")
            break
    for net, opt in ((ddp_model, optim), (fresh_ddp, fresh_optim)):
        for x, y in more:
            opt.zero_grad()
            torch.nn.functional.mse_loss(net(x), y).backward()
            opt.step()
    for p, q in zip(model.parameters(), fresh.parameters()):
        # the state right after loading is compared exactly (above); two DDP instances may sum
        # gradients in another order, so the next steps agree to rounding only
        same = torch.allclose(p, q, rtol=1e-5, atol=1e-6)
        if not same:
            problems.append(f"after {len(more)} more steps the resumed run diverges from the original "
                            f"(max difference {float((p - q).abs().max()):.3g})")
            break
    odd = odd_arithmetic(run, run.all_gather(same_batch_losses(run, model)))
    if odd:  # the cause of a divergence on every rank: say it first
        problems.insert(0, odd)
    reports = run.all_gather(problems)
    bad = [(i, p) for i, ps in enumerate(reports) for p in ps]
    run.barrier()
    _remove(run, path)
    if bad:
        first = bad[0][1] if bad[0][1].startswith("rank ") else f"rank {bad[0][0]}: {bad[0][1]}"
        run.set(CHECKPOINT.name, FAILED, first, problems=[f"rank {i}: {p}" for i, p in bad])
    else:
        run.set(CHECKPOINT.name, PASSED, f"saved and resumed: same parameters and optimizer state, and the same "
                f"parameters after {len(more)} more steps on all ranks")


#: Forward passes of the determinism probe; the relative difference between ranks still taken as equal
#: (ranks on different CPU models or GPU generations round differently in their BLAS kernels).
PROBE_REPEATS = 3
ACROSS_RANKS_RTOL = 1e-4


def same_batch_losses(run: Run, model: Any) -> list[float]:
    """The loss of ``model`` (identical on every rank) on one batch every rank draws alike, computed
    :data:`PROBE_REPEATS` times: the same on every rank, and each time, where arithmetic is deterministic."""
    torch = run.torch
    gen = torch.Generator().manual_seed(4321)
    x = torch.randn(64, 32, generator=gen).to(run.torch_device())
    y = torch.tanh(x.sum(dim=1, keepdim=True) / 8)
    with torch.no_grad():
        return [float(torch.nn.functional.mse_loss(model(x), y).cpu()) for _ in range(PROBE_REPEATS)]


def odd_arithmetic(run: Run, losses: list[list[float]]) -> str | None:
    """The rank whose loss on the same model and batch changes from one pass to the next, else one whose
    loss differs from the other ranks' (beyond :data:`ACROSS_RANKS_RTOL`), named with its host; None
    where every rank agrees. A rank like that makes the resumed run diverge on every rank: DDP averages
    its gradients into everyone's."""
    hosts = [str(r.get("host", "?")) for r in run.ranks] if len(run.ranks) == len(losses) else ["?"] * len(losses)
    for rank, values in enumerate(losses):
        if len(set(values)) > 1:
            return (f"rank {rank} on {hosts[rank]} is not deterministic: the same model and batch give loss "
                    f"{', '.join(f'{v:.9g}' for v in values)} in {len(values)} passes")
    firsts = sorted(v[0] for v in losses)
    middle = firsts[len(firsts) // 2]
    for rank, values in enumerate(losses):
        if abs(values[0] - middle) > ACROSS_RANKS_RTOL * abs(middle):
            return (f"rank {rank} on {hosts[rank]} computes another loss on the same model and batch: {values[0]:.9g}, "
                    f"the other ranks {middle:.9g}")
    return None
