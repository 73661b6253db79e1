"""Our numbers beside the peers' own (docs/method.md#peers).

Two halves:
- `estimators` (with `cases`, `llm_analysis`, `zero`): our cost model's memory and throughput predictions for the
  in-scope rows of conf/published and the paper's setting, next to llm-analysis's estimates and DeepSpeed's ZeRO
  model-state estimators, with why they differ. `python -m tspbench.validate` prints it as its last section.
- `torch_plans`: PyTorch's own tensor-parallel plans (parallelize_module; torchtitan's Llama plan) for Hugging Face's
  LlamaForCausalLM, and a CommDebugMode that also records each collective's buffer size, which tests/peers hold our
  tp, tp_msp and fsdp_sp schemes to.

Only tspbench/validate.py and the report import this package; the peers themselves (llm-analysis, deepspeed,
transformers) are optional: each part says what is missing instead of failing.
"""
