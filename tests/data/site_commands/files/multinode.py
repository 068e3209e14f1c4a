"""Stand-in for multinode.py of the PyTorch DDP tutorial (LUMI's container-wrapper page): the same
program as multigpu.py, which torchrun's c10d rendezvous spreads over nodes."""

from multigpu import main

if __name__ == "__main__":
    main()
