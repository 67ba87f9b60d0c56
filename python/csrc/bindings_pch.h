// Precompiled header for the binding layer: torch's pybind11 with its tensor casters, and
// the dispatcher. These dominate the compile time of every file in python/csrc.
#pragma once
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/utils/pybind.h>
