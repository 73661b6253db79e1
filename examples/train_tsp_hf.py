"""Train a small random-weight Hugging Face Llama with TSP on CPU: torchrun --nproc-per-node 2 train_tsp_hf.py"""

import sys

import torch
import torch.distributed as dist
from transformers import LlamaConfig, LlamaForCausalLM

import tspbench

dist.init_process_group("gloo")  # "nccl" on GPUs (then model.cuda() before parallelize)
torch.manual_seed(0)  # the same initial weights on every rank
config = LlamaConfig(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=256,
)
model = tspbench.parallelize(LlamaForCausalLM(config), scheme="tsp", seq_len=64)  # 1/D of every weight, 1/D of tokens
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)  # on this rank's shards
for step in range(int(sys.argv[1]) if len(sys.argv) > 1 else 10):
    ids = torch.randint(0, 256, (2, 64), generator=torch.Generator().manual_seed(step))  # same batch on every rank
    loss = model(ids, labels=ids).loss  # the global batch's mean loss; the module keeps this rank's tokens
    loss.backward()  # gradients synchronised when backward ends
    opt.step()
    opt.zero_grad()
    if dist.get_rank() == 0:
        print(f"step {step} loss {loss.item():.4f}", flush=True)
dist.destroy_process_group()
