// Precompiled header for the C++ core: the ATen/c10 pieces nearly every file of ir, passes
// and runtime needs. Kept to the dispatcher and IValue; never torch/extension.h.
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
