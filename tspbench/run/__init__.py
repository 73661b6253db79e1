"""The measured path: experiment (schema) → grid (RunSpecs) → checks + fate (refused, or decided once) →
dispatch (each spec as decided) → supervise (one torchrun rank group per measured run) → worker."""
