"""Stand-in for multinode_olcf.py of OLCF's PyTorch-on-Frontier guide: the same arguments and output
lines, ranks from mpi4py as the guide does, gloo on the CPU. The guide's program needs a GPU (nccl,
``torch.cuda.set_device``) and divides by the GPU count, which is 0 here (standin.py)."""

import argparse
import os

import mpi4py.MPI as MPI  # before torch, as the validation job does (cray-mpich NIC_POLICY check)
import torch
import torch.distributed as dist
from standin import finish, probe, train

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="simple distributed training job")
    parser.add_argument("total_epochs", type=int)
    parser.add_argument("save_every", type=int)
    parser.add_argument("--batch_size", default=32, type=int)
    parser.add_argument("--master_addr", type=str, required=True)
    parser.add_argument("--master_port", type=str, required=True)
    args = parser.parse_args()
    print("num_gpus_per_node = " + str(torch.cuda.device_count()), flush=True)
    comm = MPI.COMM_WORLD
    os.environ.update(WORLD_SIZE=str(comm.Get_size()), RANK=str(comm.Get_rank()),
                      MASTER_ADDR=args.master_addr, MASTER_PORT=args.master_port)
    dist.init_process_group(backend="gloo", init_method="env://")
    probe("MIOPEN_USER_DB_PATH", "CONDA_PREFIX")
    train(args.total_epochs, args.save_every, args.batch_size, rank=comm.Get_rank(), checkpoint="snapshot.pt")
    finish()
