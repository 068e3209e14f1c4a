"""The shared part of the stand-in programs that sitestack's site-command tests run in place of the
documents' own examples (tests/data/site_commands/*.yaml, ``files:``).

The documents' programs need a GPU (``model.to(0)``, the ``nccl`` backend) or download data; the
twins have neither. A stand-in keeps the command line and the output lines the document shows
(``[GPU0] Epoch 0 | Batchsize: 32 | Steps: 64``), trains a linear model on random data on the CPU
(gloo where distributed), and prints probe lines the runner checks:

    sitestack-probe: torch_file=<torch.__file__>
    sitestack-probe: world_size=<n>          (distributed runs, after the process group is up)
    sitestack-probe: env <NAME>=<value>      (each name asked for; empty when unset)
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

PROBE = "sitestack-probe:"
SAMPLES = 2048   # the documents' MyTrainDataset(2048): 64 steps of 32 on one rank


def say(line: str) -> None:
    """One line in one write: the ranks share the job's output file, and print() writes the text and its
    newline separately when stdout is unbuffered (torchrun's children), so two ranks' lines could run into
    one another ("...__init__.pysitestack-probe: ...")."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def probe(*names: str) -> None:
    """Print where torch comes from, the world size once distributed, and the named variables."""
    say(f"{PROBE} torch_file={torch.__file__}")
    if dist.is_available() and dist.is_initialized():
        say(f"{PROBE} world_size={dist.get_world_size()}")
    for name in names:
        say(f"{PROBE} env {name}={os.environ.get(name, '')}")


class RandomDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """The documents' MyTrainDataset: ``size`` pairs of random tensors."""

    def __init__(self, size: int) -> None:
        self.data = [(torch.rand(20), torch.rand(1)) for _ in range(size)]

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.data[index]


def init_from_env() -> tuple[int, int]:
    """Join the process group the launcher describes (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT):
    nccl where a GPU is visible, else gloo. Returns (rank, local rank)."""
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend=backend, init_method="env://")
    return dist.get_rank(), int(os.environ.get("LOCAL_RANK", "0"))


def train(epochs: int, save_every: int, batch_size: int, *, rank: int | None, checkpoint: str) -> None:
    """Train for ``epochs``, printing the documents' lines; ``rank`` None for one process."""
    data = RandomDataset(SAMPLES)
    sampler = DistributedSampler(data) if rank is not None else None
    loader = DataLoader(data, batch_size=batch_size, shuffle=sampler is None, sampler=sampler)
    model: torch.nn.Module = torch.nn.Linear(20, 1)
    if rank is not None:
        model = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    label = rank if rank is not None else 0
    for epoch in range(epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)
        say(f"[GPU{label}] Epoch {epoch} | Batchsize: {batch_size} | Steps: {len(loader)}")
        for source, targets in loader:
            optimizer.zero_grad()
            F.mse_loss(model(source), targets).backward()
            optimizer.step()
        if label == 0 and epoch % save_every == 0:
            torch.save(model.state_dict(), checkpoint)
            kind = "checkpoint" if rank is None else "snapshot"
            say(f"Epoch {epoch} | Training {kind} saved at {checkpoint}")


def finish() -> None:
    """Leave the process group together: a barrier first, so no rank tears gloo down while another
    still has traffic in flight (without it, a rank sometimes aborted at exit with "terminate called
    without an active exception" under torchrun's c10d rendezvous)."""
    dist.barrier()
    dist.destroy_process_group()
