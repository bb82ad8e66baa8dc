#!/usr/bin/env python3
"""PyTorch's side of xshard's training-step benchmarks: the same steps, one JSON line each.

Each case is the step of an xshard benchmark, with the same sizes, element type, optimizer
and batch split, written as a PyTorch user writes it (torchvision's ResNet-18, nn.Linear,
nn.TransformerEncoderLayer, DistributedDataParallel over gloo with its default buckets):

  resnet18_step_dp<p>_f32      bench_convnet: ResNet-18 (10 classes), a global batch of 64
                               images of 3 x 32 x 32 split over the ranks, batch norm on each
                               rank's rows, forward, a fixed logits gradient (1e-3), backward
                               with the gradients averaged over the ranks, SGD with momentum
                               0.9, gradients zeroed.
  mlp_step_dp<p>_<f64|f32>     bench_training: Linear(1024 -> 4096), GELU (erf), Linear(4096
                               -> 1024), a global batch of 64 rows, cross-entropy over the
                               1024 outputs as classes, SGD with momentum 0.9.
  transformer_step_dp<p>_<f64|f32>  bench_training: one pre-norm transformer block (512
                               features, 8 heads, causal attention, MLP hidden 2048 with GELU),
                               8 sequences of 64 tokens, cross-entropy over the 512 outputs.

A case's name is the xshard case it matches at that rank count, so `side_by_side.py` joins
the two programs' lines into ratios. Every rank runs one thread (torch.set_num_threads(1)),
as every xshard rank runs one OpenBLAS thread.

Launch it as xshard's programs are launched: `mpirun -n P python3 torch_steps.py`. The rank
and the world size come from Open MPI's environment (OMPI_COMM_WORLD_RANK / _SIZE) or from
torchrun's (RANK / WORLD_SIZE); the ranks meet over TCP at MASTER_ADDR:MASTER_PORT
(127.0.0.1:29533 unless set). A repetition starts after a barrier and its time is the
slowest rank's; a case's figure is the median of --reps repetitions, after two warm-up steps.
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn


def world():
    """This process's rank and the world size, from the launcher's environment."""
    env = os.environ
    rank = int(env.get("OMPI_COMM_WORLD_RANK", env.get("RANK", "0")))
    size = int(env.get("OMPI_COMM_WORLD_SIZE", env.get("WORLD_SIZE", "1")))
    return rank, size


def parse():
    a = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    a.add_argument("--reps", type=int, default=7, help="timed repetitions per case (7)")
    a.add_argument("--filter", default="",
                   help="only cases whose name contains this (or one of these, comma-separated)")
    a.add_argument("--quick", action="store_true",
                   help="small sizes, one repetition: checks that the script runs")
    return a.parse_args()


def slowest(seconds):
    """The largest of every rank's `seconds`."""
    if dist.is_initialized():
        t = torch.tensor([seconds], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())
    return seconds


def barrier():
    if dist.is_initialized():
        dist.barrier()


def timed(step, reps):
    """Median over `reps` of one step's seconds on the slowest rank, after two warm-ups."""
    for _ in range(2):
        step()
    times = []
    for _ in range(reps):
        barrier()
        start = time.perf_counter()
        step()
        times.append(slowest(time.perf_counter() - start))
    return statistics.median(times)


def parallel(model, size):
    """`model` under DistributedDataParallel (gloo, default buckets) on more than one rank."""
    if size == 1:
        return model
    return nn.parallel.DistributedDataParallel(model)


def local_rows(total, rank, size):
    """This rank's rows of `total` (an equal share; the cases' batches divide evenly)."""
    return slice(rank * total // size, (rank + 1) * total // size)


def resnet18_case(rank, size, quick):
    import torchvision

    torch.manual_seed(1)
    batch, side = (8, 16) if quick else (64, 32)
    model = parallel(torchvision.models.resnet18(num_classes=10), size)
    x = (torch.rand(batch, 3, side, side) * 2 - 1)[local_rows(batch, rank, size)]
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step():
        y = model(x)
        y.backward(torch.full_like(y, 1e-3))
        opt.step()
        opt.zero_grad(set_to_none=False)

    return step, batch


def loss_step(model, x, labels, lr):
    """A step of `model` on x with cross-entropy against `labels`: forward, backward, SGD."""
    loss_fn = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)

    def step():
        out = model(x)
        loss = loss_fn(out.reshape(-1, out.shape[-1]), labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)

    return step


def mlp_case(rank, size, quick, dtype):
    torch.manual_seed(1)
    features, hidden, batch = (64, 256, 16) if quick else (1024, 4096, 64)
    model = nn.Sequential(nn.Linear(features, hidden), nn.GELU(), nn.Linear(hidden, features))
    model = parallel(model.to(dtype), size)
    rows = local_rows(batch, rank, size)
    x = torch.randn(batch, features, dtype=dtype)[rows]
    labels = torch.randint(0, features, (batch,))[rows]
    return loss_step(model, x, labels, 1e-3), batch


class causal_block(nn.Module):
    """nn.TransformerEncoderLayer, pre-norm, GELU, no dropout, with a causal mask."""

    def __init__(self, features, heads, hidden, sequence):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(features, heads, hidden, dropout=0.0,
                                                activation="gelu", batch_first=True,
                                                norm_first=True)
        self.register_buffer("mask", torch.triu(
            torch.full((sequence, sequence), float("-inf")), diagonal=1))

    def forward(self, x):
        return self.layer(x, src_mask=self.mask)  # converted with the module by .to(dtype)


def transformer_case(rank, size, quick, dtype):
    torch.manual_seed(1)
    features, heads, sequence, sequences, hidden = ((32, 4, 8, 4, 64) if quick
                                                    else (512, 8, 64, 8, 2048))
    if sequences % size:
        return None, sequences
    model = parallel(causal_block(features, heads, hidden, sequence).to(dtype), size)
    seqs = local_rows(sequences, rank, size)
    x = torch.randn(sequences, sequence, features, dtype=dtype)[seqs]
    labels = torch.randint(0, features, (sequences, sequence))[seqs].reshape(-1)
    return loss_step(model, x, labels, 1e-3), sequences


def main():
    args = parse()
    rank, size = world()
    torch.set_num_threads(1)
    if size > 1:
        addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
        port = os.environ.get("MASTER_PORT", "29533")
        dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank,
                                world_size=size)
    reps = 1 if args.quick else max(1, args.reps)
    types = {"f64": torch.float64, "f32": torch.float32}
    cases = [(f"resnet18_step_dp{size}_f32", lambda: resnet18_case(rank, size, args.quick))]
    for suffix, dtype in types.items():
        cases.append((f"mlp_step_dp{size}_{suffix}",
                      lambda d=dtype: mlp_case(rank, size, args.quick, d)))
    for suffix, dtype in types.items():
        cases.append((f"transformer_step_dp{size}_{suffix}",
                      lambda d=dtype: transformer_case(rank, size, args.quick, d)))
    for name, make in cases:
        if not any(f in name for f in args.filter.split(",")):
            continue
        step, batch = make()
        if step is None:
            if rank == 0:
                print(f"torch_steps: {name} skipped: its batch of {batch} does not divide "
                      f"over {size} ranks", file=sys.stderr)
            continue
        seconds = timed(step, reps)
        if rank == 0:
            print(json.dumps({"name": name, "ranks": size, "seconds": round(seconds, 6),
                              "peer": "pytorch", "version": torch.__version__,
                              "threads_per_rank": torch.get_num_threads(),
                              "backend": "gloo" if size > 1 else "none"}), flush=True)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
