"""Train a small random-weight Hugging Face Llama with TSP: torchrun --nproc-per-node 2 train_tsp_hf.py [steps]
(one GPU per rank when CUDA is available, NCCL; else CPU ranks, gloo)."""

import os
import sys

import torch
import torch.distributed as dist
from transformers import LlamaConfig, LlamaForCausalLM

import tspbench

cuda = torch.cuda.is_available()
if cuda:
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))  # this rank's GPU, before any CUDA work (else all on cuda:0)
dist.init_process_group("nccl" if cuda else "gloo")
torch.manual_seed(0)  # the same initial weights on every rank
config = LlamaConfig(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=256,
)
model = LlamaForCausalLM(config)
if cuda:
    model = model.cuda()  # onto this rank's GPU (set above) before parallelize
model = tspbench.parallelize(model, scheme="tsp", seq_len=64)  # 1/D of every weight, 1/D of the tokens
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)  # on this rank's shards
for step in range(int(sys.argv[1]) if len(sys.argv) > 1 else 10):
    ids = torch.randint(0, 256, (2, 64), generator=torch.Generator().manual_seed(step))  # same batch on every rank
    loss = model(ids, labels=ids).loss  # the module moves the batch to the model's device, keeps this rank's tokens
    loss.backward()  # gradients synchronised when backward ends
    opt.step()
    opt.zero_grad()
    if dist.get_rank() == 0:
        print(f"step {step} loss {loss.item():.4f}", flush=True)
dist.destroy_process_group()
