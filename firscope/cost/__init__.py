"""What the kernels would cost on a GPU: a speed-of-light analysis from recorded execution.

  find_device(name) / load_devices() -> Device       device profiles (devices.toml + user file)
  analyse_position(model, device, ids, at) -> CostReport   feed a prompt, cost one step
  analyse_step(model, device, arena=..., position=, token=) -> CostReport
  analyse_current(model, machine, device) / analyse_node(...)   a debugger's step / node
  record(program, arena) / count(...) -> Counts       one dispatch in GPU terms
  predict(counts, device) -> Prediction               the model: terms, bound, advice
It predicts; it does not measure (docs/cost-model.md).
"""
from .analyze import (CostReport, NodeCost, analyse_current, analyse_node, analyse_position,
                      analyse_step, counts_dict, current_step)
from .devices import DEFAULT_DEVICE, Device, device_table, find_device, load_devices, user_file
from .model import BOUNDS, Prediction, ext_counts, predict
from .record import Counts, LineStats, Trace, count, data_independent, geometry, record

__all__ = ["CostReport", "NodeCost", "analyse_current", "analyse_node", "analyse_position",
           "analyse_step", "counts_dict", "current_step",
           "DEFAULT_DEVICE", "Device", "device_table", "find_device", "load_devices",
           "user_file", "BOUNDS", "Prediction", "ext_counts", "predict", "Counts", "LineStats",
           "Trace", "count", "data_independent", "geometry", "record"]
