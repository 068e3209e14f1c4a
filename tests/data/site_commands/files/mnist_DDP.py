"""Stand-in for mnist_DDP.py of LUMI's PyTorch page (lumi-reframe-tests), which downloads MNIST and
needs GPUs: the same options (``--gpu --modelpath DIR``), run by conda-python-distributed with
RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT from it; a few DDP steps on random data (standin.py)."""

import argparse

from standin import finish, init_from_env, probe, train

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpu", action="store_true")
    parser.add_argument("--modelpath", default="model")
    args = parser.parse_args()
    rank, _ = init_from_env()
    probe("CONDA_PREFIX", "NCCL_DEBUG", "NCCL_SOCKET_IFNAME", "NCCL_NET_GDR_LEVEL", "MIOPEN_USER_DB_PATH")
    train(2, 1, 32, rank=rank, checkpoint=f"{args.modelpath}/model_gpu.pt")
    finish()
