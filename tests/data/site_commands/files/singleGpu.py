"""Stand-in for singleGpu.py of LUMI's container-wrapper page (the PyTorch DDP tutorial's single-GPU
program): the same arguments and output lines, on the CPU (standin.py)."""

import argparse

from standin import probe, train

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="simple distributed training job")
    parser.add_argument("total_epochs", type=int)
    parser.add_argument("save_every", type=int)
    parser.add_argument("--batch_size", default=32, type=int)
    args = parser.parse_args()
    probe()
    train(args.total_epochs, args.save_every, args.batch_size, rank=None, checkpoint="checkpoint.pt")
