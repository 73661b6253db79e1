"""Paper scale without the devices: the fake-tensor estimate, its memory tracker, the one-GPU check, and the
closed-form cost model."""
