"""Stand-in for multigpu.py / multinode.py of the PyTorch DDP tutorial that LUMI's container-wrapper
page runs under torchrun: the same arguments and output lines, gloo on the CPU (standin.py)."""

import argparse

from standin import finish, init_from_env, probe, train


def main() -> None:
    parser = argparse.ArgumentParser(description="simple distributed training job")
    parser.add_argument("total_epochs", type=int)
    parser.add_argument("save_every", type=int)
    parser.add_argument("--batch_size", default=32, type=int)
    args = parser.parse_args()
    rank, _ = init_from_env()
    probe("LOCAL_RANK", "NCCL_SOCKET_IFNAME")
    train(args.total_epochs, args.save_every, args.batch_size, rank=rank, checkpoint="snapshot.pt")
    finish()


if __name__ == "__main__":
    main()
