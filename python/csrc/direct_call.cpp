// The direct calls of direct_call.h: learned plans of captured inference signatures run
// from C++ (see the header for what they check and in what order).
#include "direct_call.h"

#include <algorithm>

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/SavedTensorHooks.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>

#include <optional>

#include "magi/common/error.h"
#include "magi/common/log.h"
#include "values.h"

namespace magi::bindings {
namespace {

/// Verified fingerprints kept per direct call (fast_dispatch_guards="arguments"); calls with
/// later ones are checked by Dynamo's guards every time.
constexpr size_t kMaxVerified = 256;
/// A watch that fails within kQuickCalls calls of being listed, kMaxQuickFailures times in a
/// row, is given up (the guards then run on every call).
constexpr size_t kQuickCalls = 16;
constexpr size_t kMaxQuickFailures = 4;

// Bumped when a direct call finds that a submodule it reads parameters through was replaced
// (Routes) or that a dict it gathers from is no longer the one the frame reaches: direct calls
// learned before are stale. Read and written with the GIL held.
uint64_t g_registration_epoch = 0;
// Calls a DirectEntry ran directly (get_counters().direct_calls adds them), GIL-protected.
uint64_t g_direct_calls = 0;
// The last generation of fixed inputs any direct call took: generations are unique in the
// process, so a CUDA graph runner two direct calls share cannot mistake one's for the other's
// (runtime::SteadyInputs). GIL-protected.
uint64_t g_fixed_generations = 0;

/// The interned name "training" (module.training is read on every call).
PyObject* training_name() {
  static PyObject* name = PyUnicode_InternFromString("training");
  return name;
}

/// The address of `t`'s memory, or nullopt for a tensor without storage or one that refuses
/// access to it (fake and functional tensors).
std::optional<const void*> memory_of(const at::Tensor& t) {
  if (!t.has_storage()) return std::nullopt;
  try {
    return t.storage().data();
  } catch (const c10::Error&) {
    return std::nullopt;
  }
}

/// Appends what Dynamo's tensor guards compare of `t` (its Python type `type`, when known).
void append_tensor(const at::Tensor& t, PyTypeObject* type, std::vector<int64_t>* key) {
  key->push_back(reinterpret_cast<intptr_t>(type));
  key->push_back(static_cast<int64_t>(t.key_set().raw_repr()));
  key->push_back(static_cast<int64_t>(t.scalar_type()));
  key->push_back(static_cast<int64_t>(t.device().type()));
  key->push_back(t.device().index());
  key->push_back(t.requires_grad());
  key->push_back(t.dim());
  for (int64_t d = 0; d < t.dim(); ++d) {
    key->push_back(t.size(d));
    key->push_back(t.stride(d));
  }
  key->push_back(t.storage_offset());
}

/// Appends the process state Dynamo's global guards compare; false under a torch-function or
/// dispatch mode (Dynamo compares the modes themselves, which a fingerprint does not).
bool append_global_state(std::vector<int64_t>* key) {
  if (at::impl::PythonTorchFunctionTLS::stack_len() > 0 ||
      c10::impl::TorchDispatchModeTLS::stack_len() > 0) {
    return false;
  }
  const at::Context& ctx = at::globalContext();
  key->push_back(static_cast<int64_t>(ctx.float32MatmulPrecision()));
  key->push_back(ctx.allowTF32CuDNN());
  key->push_back(static_cast<int64_t>(ctx.allowFP16ReductionCuBLAS()));
  key->push_back(static_cast<int64_t>(ctx.allowBF16ReductionCuBLAS()));
  key->push_back(ctx.deterministicAlgorithms());
  key->push_back(ctx.deterministicAlgorithmsWarnOnly());
  key->push_back(static_cast<int64_t>(c10::typeMetaToScalarType(c10::get_default_dtype())));
  key->push_back(at::get_num_threads());
  key->push_back(static_cast<int64_t>(at::impl::PythonTorchFunctionTLS::get_disabled_state()));
  // Dynamo's tensor guards see dispatch keys through the thread's included and excluded sets
  // (inference_mode differs from no_grad there).
  const c10::impl::LocalDispatchKeySet local = c10::impl::tls_local_dispatch_key_set();
  key->push_back(static_cast<int64_t>(local.included_.raw_repr()));
  key->push_back(static_cast<int64_t>(local.excluded_.raw_repr()));
  return true;
}

/// Appends what Dynamo's guards can see of the arguments `argv[first, n)`; false when an
/// argument is neither a tensor, a scalar the signature compares by value nor an empty dict
/// (Dynamo alone guards its contents).
bool append_arguments(PyObject* const* argv, size_t first, size_t n, std::vector<int64_t>* key) {
  for (size_t i = first; i < n; ++i) {
    PyObject* obj = argv[i];
    if (!THPVariable_Check(obj)) {
      if (PyLong_CheckExact(obj)) {
        int overflow = 0;
        PyLong_AsLongLongAndOverflow(obj, &overflow);
        if (overflow != 0) return false;  // the signature does not compare it
      } else if (PyDict_CheckExact(obj)) {
        // A **kwargs parameter: Dynamo's guards see an empty one's type and length only.
        if (PyDict_GET_SIZE(obj) != 0) return false;
        key->push_back(-2);
        continue;
      } else if (obj != Py_None && !PyBool_Check(obj) && !PyFloat_CheckExact(obj) &&
                 !PyUnicode_CheckExact(obj)) {
        return false;
      }
      key->push_back(-1);
      continue;
    }
    const at::Tensor& t = THPVariable_Unpack(obj);
    append_tensor(t, Py_TYPE(obj), key);
    int64_t alias = -1;  // the same tensor passed twice is a guard of its own
    for (size_t j = first; j < i; ++j) {
      if (THPVariable_Check(argv[j]) &&
          THPVariable_Unpack(argv[j]).unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) {
        alias = static_cast<int64_t>(j);
        break;
      }
    }
    key->push_back(alias);
  }
  return true;
}

}  // namespace

void bump_registration_epoch() { ++g_registration_epoch; }
uint64_t registration_epoch() { return g_registration_epoch; }
uint64_t direct_entry_calls() { return g_direct_calls; }
void reset_direct_entry_calls() { g_direct_calls = 0; }

namespace {

PyObject* modules_name() {
  static PyObject* name = PyUnicode_InternFromString("_modules");
  return name;
}

}  // namespace

Routes::Routes(const py::list& steps) {
  for (py::handle item : steps) {
    const py::tuple step = py::reinterpret_borrow<py::tuple>(item);
    MAGI_ASSERT(step.size() == 3, "Routes: a step is (module, name, submodule)");
    PyObject* module = step[0].ptr();
    auto found = std::find_if(parents_.begin(), parents_.end(),
                              [&](const Parent& p) { return p.module.get() == module; });
    if (found == parents_.end()) {
      Parent parent;
      parent.module = Held::of(step[0]);
      parents_.push_back(std::move(parent));
      found = parents_.end() - 1;
    }
    found->children.emplace_back(py::reinterpret_borrow<py::object>(step[1]), Held::of(step[2]));
    ++size_;
  }
  // Nothing seen yet: the first hold() reads every dict and records the versions.
}

bool Routes::hold() {
  for (Parent& parent : parents_) {
    PyObject* module = parent.module.get();
    if (module == nullptr) return false;
    PyObject* instance = instance_dict(module);
    if (instance == nullptr) return false;
    const uint64_t instance_version = dict_version(instance);
    if (instance != parent.instance_dict || instance_version == 0 ||
        instance_version != parent.instance_version) {
      PyObject* modules = PyDict_GetItemWithError(instance, modules_name());
      if (modules == nullptr && PyErr_Occurred()) throw py::error_already_set();
      if (modules == nullptr || !PyDict_Check(modules)) return false;
      if (parent.modules != nullptr && modules != parent.modules) return false;  // replaced
      parent.instance_dict = instance;
      parent.instance_version = instance_version;
      if (parent.modules == nullptr) parent.modules_version = 0;  // read the names below
      parent.modules = modules;
    }
    const uint64_t modules_version = dict_version(parent.modules);
    if (modules_version != 0 && modules_version == parent.modules_version) continue;
    for (const auto& [name, child] : parent.children) {
      PyObject* now = PyDict_GetItemWithError(parent.modules, name.ptr());
      if (now == nullptr && PyErr_Occurred()) throw py::error_already_set();
      if (now == nullptr || now != child.get()) return false;
    }
    parent.modules_version = modules_version;
  }
  return true;
}

DirectCall::DirectCall(py::object signature, py::object guard_check,
                       std::vector<std::string> frame_names,
                       std::vector<std::pair<std::string, py::object>> cells, py::object target,
                       const py::list& slots, const std::string& result, bool method, bool memoize,
                       py::object planner, py::object routes, py::object builder,
                       py::object varargs, const std::vector<size_t>& through)
    : signature_obj_(std::move(signature)),
      guard_check_(std::move(guard_check)),
      cells_(std::move(cells)),
      target_(std::move(target)),
      planner_(std::move(planner)),
      routes_obj_(std::move(routes)),
      builder_(std::move(builder)),
      method_(method),
      memoize_(memoize) {
  if (!routes_obj_.is_none()) routes_ = routes_obj_.cast<Routes*>();
  signature_ = signature_obj_.cast<const runtime::GuardSignature*>();
  for (const std::string& name : frame_names) {
    frame_names_.push_back(
        py::reinterpret_steal<py::str>(PyUnicode_InternFromString(name.c_str())));
  }
  if (!varargs.is_none()) {
    const py::tuple names = varargs.cast<py::tuple>();
    MAGI_ASSERT(names.size() == 3, "DirectCall: varargs is (owner, args, kwargs) names");
    varargs_ = true;
    owner_local_ = names[0];
    args_local_ = names[1];
    kwargs_local_ = names[2];
    MAGI_ASSERT(method_ || owner_local_.is_none(), "DirectCall: a function has no owner");
  }
  if (py::isinstance<runtime::CudaGraphRunner>(target_)) {
    runner_ = target_.cast<runtime::CudaGraphRunner*>();
  } else {
    executable_ = target_.cast<const runtime::Executable*>();
  }
  for (py::handle item : slots) {
    const py::tuple spec = py::reinterpret_borrow<py::tuple>(item);
    const std::string kind = spec[0].cast<std::string>();
    Slot slot;
    if (kind == "arg") {
      slot.kind = Slot::kArg;
      slot.arg = spec[1].cast<size_t>();
    } else if (kind == "size" || kind == "item") {
      slot.kind = kind == "size" ? Slot::kSize : Slot::kItem;
      slot.arg = spec[1].cast<size_t>();
      slot.dim = spec[2].cast<int64_t>();
    } else {
      MAGI_ASSERT(kind == "fixed", "DirectCall: unknown input slot kind ", kind);
      slot.kind = Slot::kFixed;
      slot.dict = spec[1];
      slot.key = spec[2];
      MAGI_ASSERT(PyDict_Check(slot.dict.ptr()), "DirectCall: a fixed input needs a dict");
    }
    slots_.push_back(std::move(slot));
  }
  for (const Slot& slot : slots_) steady_.push_back(slot.kind == Slot::kFixed);
  result_ = result == "tuple"  ? Result::kTuple
            : result == "list" ? Result::kList
            : result == "call" ? Result::kCall
                               : Result::kTensor;
  MAGI_ASSERT(result == "tensor" || result == "tuple" || result == "list" || result == "call",
              "DirectCall: unknown result kind ", result);
  MAGI_ASSERT((result_ == Result::kCall) == !builder_.is_none(),
              "DirectCall: a builder goes with the result kind 'call' and only with it");
  MAGI_ASSERT(through.empty() || result_ == Result::kCall,
              "DirectCall: inputs returned as they are need a builder");
  through_at_.assign(slots_.size(), -1);
  for (size_t k = 0; k < through.size(); ++k) {
    MAGI_ASSERT(through[k] < slots_.size() && slots_[through[k]].kind != Slot::kSize,
                "DirectCall: input ", through[k], " cannot be returned as it is");
    through_at_[through[k]] = static_cast<int>(k);
  }
  num_through_ = through.size();
}

py::object DirectCall::call(const py::tuple& args) {
  const size_t n = args.size();
  PyObject* const* argv = n > 0 ? &PyTuple_GET_ITEM(args.ptr(), 0) : nullptr;
  if (!varargs_) return call_argv(argv, n, CallForm{});
  const size_t first = method_ && n > 0 ? 1 : 0;
  const py::object given =
      py::reinterpret_steal<py::object>(PyTuple_GetSlice(args.ptr(), first, n));
  if (!given) throw py::error_already_set();
  return call_argv(argv, n, CallForm{given.ptr(), nullptr});
}

py::object DirectCall::call_argv(PyObject* const* argv, size_t n, const CallForm& form) {
  if (n != frame_names_.size()) return py::none();
  const size_t first = method_ ? 1 : 0;
  if (varargs_) {
    MAGI_ASSERT(form.args != nullptr && PyTuple_Check(form.args),
                "DirectCall: a varargs frame needs the call's positional arguments");
    const bool keywords = form.kwargs != nullptr && PyDict_GET_SIZE(form.kwargs) > 0;
    if (keywords && kwargs_local_.is_none()) return py::none();  // Python raises TypeError
    if (keywords && !owner_local_.is_none()) {
      // The owner given again by keyword: Python raises TypeError.
      const int given_twice = PyDict_Contains(form.kwargs, owner_local_.ptr());
      if (given_twice < 0) throw py::error_already_set();
      if (given_twice == 1) return py::none();
    }
  }

  // The buffers kept across calls, unless another call holds them (another thread, entered
  // while this one's guards ran Python or its run had the GIL released): then buffers of
  // its own. Released (and the signature's references dropped) on every way out.
  std::vector<runtime::GuardInput> own_values;
  std::vector<int64_t> own_key;
  Lease lease(this);
  std::vector<runtime::GuardInput>& values = lease.owns ? values_ : own_values;
  std::vector<int64_t>& key = lease.owns ? key_buffer_ : own_key;

  // The compact signature: dtypes, devices, ranks, static sizes, layouts, scalar values;
  // grad mode, autocast, module.training.
  values.clear();
  for (size_t i = first; i < n; ++i) values.push_back(guard_input(argv[i]));
  bool training = false;
  if (method_) {
    PyObject* flag = PyObject_GetAttr(argv[0], training_name());
    if (flag == nullptr) {
      PyErr_Clear();  // the Python path's getattr(owner, "training", False)
    } else {
      const int truth = PyObject_IsTrue(flag);
      Py_DECREF(flag);
      if (truth < 0) throw py::error_already_set();
      training = truth == 1;
    }
  }
  const bool match = signature_->matches(values, training);
  values.clear();  // it holds references to the arguments
  if (!match) return py::none();
  if (routes_ != nullptr && !routes_->hold()) {
    ++g_registration_epoch;  // a submodule was replaced: every learned path is relearned
    return py::none();
  }

  // The inputs, gathered before the guards run as the Python path does. Parameters and
  // buffers are what their dicts hold now (re-read when a dict's version tag moved). A CUDA
  // graph runner borrows them: the fixed ones stay in the kept
  // vector from call to call (no reference counting for the unchanged), the arguments are
  // dropped from it on the way out (Lease).
  std::vector<c10::IValue> own_inputs;
  const bool kept = runner_ != nullptr && lease.owns;
  std::vector<c10::IValue>& inputs = kept ? inputs_ : own_inputs;
  if (kept) {
    inputs.resize(slots_.size());
  } else {
    inputs.reserve(slots_.size());
  }
  // The inputs the result returns as they came in.
  std::vector<py::object> through(num_through_);
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& slot = slots_[i];
    PyObject* obj = slot.kind == Slot::kFixed ? fixed_input(slot) : argv[slot.arg];
    if (obj == nullptr) return py::none();
    if (slot.kind == Slot::kItem) {
      if (!PyTuple_Check(obj) || slot.dim >= PyTuple_GET_SIZE(obj)) return py::none();
      obj = PyTuple_GET_ITEM(obj, slot.dim);
    }
    if (through_at_[i] >= 0) through[through_at_[i]] = py::reinterpret_borrow<py::object>(obj);
    c10::IValue value;
    if (slot.kind == Slot::kSize) {
      if (!THPVariable_Check(obj)) return py::none();
      const at::Tensor& t = THPVariable_Unpack(obj);
      if (slot.dim >= t.dim()) return py::none();
      value = t.size(slot.dim);
    } else if (THPVariable_Check(obj)) {
      const at::Tensor& t = THPVariable_Unpack(obj);
      if (kept && slot.kind == Slot::kFixed && inputs[i].isTensor() &&
          inputs[i].toTensor().unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) {
        continue;  // the kept entry is this tensor
      }
      value = t;
    } else {
      value = to_ivalue(obj, i);
    }
    if (kept) {
      inputs[i] = std::move(value);
    } else {
      inputs.push_back(std::move(value));
    }
  }
  // The generation of the fixed inputs just gathered: the guards below may run Python, and
  // another thread's call may start a new one before this call reaches the runner.
  const uint64_t generation = fixed_generation_;

  // Dynamo's guards of the cache entry the learning call ran, on the frame's locals; with
  // memoize, once per fingerprint of the arguments, the parameters and the process state.
  // The fingerprint is built in a buffer kept across calls, and compared with the last
  // verified one before the set (a loop calls with one layout).
  // In the default mode a verdict is reused only while the watched Python state holds; when
  // it moved, every verdict is dropped and the next check that passes lists it again.
  key.clear();
  bool have_key = false;
  const bool watch = !memoize_ && !planner_.is_none() && !unwatchable_;
  if (memoize_ || watch) {
    // The fixed inputs enter as their generation: it changes whenever one of them does.
    have_key = append_arguments(argv, first, n, &key) && append_global_state(&key) &&
               (!varargs_ || append_form(form, &key));
    key.push_back(static_cast<int64_t>(generation));
  }
  // Held for the comparison: another thread may list a new watch while this one's
  // comparisons run Python (an argument's __getattr__).
  const std::shared_ptr<Watch> watched = watch_;
  if (have_key && watch && watching_ && watched != nullptr && !watched->holds(argv, n)) {
    forget_watch();
  }
  const bool hooks_set = watching_ && watched != nullptr && watched->saved_hooks &&
                         at::SavedTensorDefaultHooks::get_hooks(true).has_value();
  const bool reusable = have_key && (memoize_ || watching_) && !hooks_set;
  if (!reusable || (key != last_verified_ && verified_.count(key) == 0)) {
    py::dict frame;
    if (!guards_pass(argv, n, form, &frame)) return py::none();
    if (have_key && watch && !watching_ && !start_watching(frame)) return py::none();
    if (have_key && (memoize_ || watching_) && verified_.size() < kMaxVerified) {
      verified_.insert(key);
    }
  }
  if (have_key && (memoize_ || watching_) && key != last_verified_) last_verified_ = key;
  ++calls_;
  lease.ran = true;

  std::vector<c10::IValue> outputs;
  {
    py::gil_scoped_release no_gil;
    // The fixed inputs are this generation's tensors, checked above: the runner compares
    // them only when the generation is new to it.
    const runtime::SteadyInputs steady{generation, &steady_};
    outputs = kept                 ? runner_->run_borrowed(inputs, steady)
              : runner_ != nullptr ? runner_->run(std::move(inputs), steady)
                                   : executable_->run(std::move(inputs));
  }
  if (result_ == Result::kTensor) {
    MAGI_ASSERT(outputs.size() == 1, "DirectCall: one output expected, the graph returned ",
                outputs.size());
    return to_python(outputs[0]);
  }
  py::list list(outputs.size() + through.size());
  for (size_t i = 0; i < outputs.size(); ++i) list[i] = to_python(outputs[i]);
  for (size_t k = 0; k < through.size(); ++k) {
    list[outputs.size() + k] = std::move(through[k]);
  }
  if (result_ == Result::kList) return std::move(list);
  if (result_ == Result::kCall) return builder_(list);
  return py::tuple(list);
}

void DirectCall::next_generation() {
  fixed_generation_ = ++g_fixed_generations;
  verified_.clear();
  last_verified_.clear();
}

PyObject* DirectCall::fixed_input(Slot& slot) {
  PyObject* obj = slot.held;
  const uint64_t version = dict_version(slot.dict.ptr());
  if (version == 0 || version != slot.version || obj == nullptr) {
    obj = PyDict_GetItemWithError(slot.dict.ptr(), slot.key.ptr());
    if (obj == nullptr && PyErr_Occurred()) throw py::error_already_set();
    if (obj == nullptr || !THPVariable_Check(obj)) {
      slot.held = nullptr;
      return nullptr;
    }
    slot.held = obj;
    slot.version = version;
  }
  const at::Tensor& t = THPVariable_Unpack(obj);
  const std::optional<const void*> memory = memory_of(t);
  if (t.layout() != c10::kStrided || t.is_nested() || !memory) {
    // No strides or memory to compare: each call is a generation of its own (Dynamo's
    // guards decide).
    slot.state = TensorState();
    slot.memory = nullptr;
    next_generation();
  } else if (!slot.state.same(t, Py_TYPE(obj)) || *memory != slot.memory) {
    slot.state.take(t, Py_TYPE(obj));
    slot.memory = *memory;
    next_generation();
  }
  return obj;
}

void DirectCall::forget_watch() {
  watching_ = false;
  verified_.clear();
  last_verified_.clear();
  quick_failures_ = calls_ - listed_at_ < kQuickCalls ? quick_failures_ + 1 : 0;
  if (quick_failures_ >= kMaxQuickFailures) {
    unwatchable_ = true;
    watch_ = nullptr;
    MAGI_LOG_DEBUG("direct call: the Python state Dynamo's guards read moved ", kMaxQuickFailures,
                   " times within ", kQuickCalls,
                   " calls of being listed; the guards are evaluated on every call");
  }
}

bool DirectCall::start_watching(const py::dict& frame) {
  py::object plan = planner_(frame);
  if (plan.is_none()) {
    unwatchable_ = true;
    watch_ = nullptr;
    return true;
  }
  const py::tuple parts = plan.cast<py::tuple>();
  const py::list containers = parts[7].cast<py::list>();
  size_t i = 0;
  for (const Slot& slot : slots_) {
    if (slot.kind != Slot::kFixed) continue;
    if (i >= containers.size() || containers[i++].ptr() != slot.dict.ptr()) {
      ++g_registration_epoch;
      return false;
    }
  }
  auto listed = std::make_shared<Watch>();
  if (!listed->load(parts)) {
    unwatchable_ = true;
    watch_ = nullptr;
    return true;
  }
  // The walk ran Python after the check (another thread may have run): the guards are
  // checked again on the state just listed, and the listing is used only if they pass.
  ++guard_checks_;
  if (!check_frame(frame)) return true;
  watch_ = std::move(listed);
  watching_ = true;
  listed_at_ = calls_;
  return true;
}

bool DirectCall::append_form(const CallForm& form, std::vector<int64_t>* key) const {
  key->push_back(PyTuple_GET_SIZE(form.args));
  if (form.kwargs == nullptr) return true;
  const size_t first = method_ ? 1 : 0;
  PyObject* name = nullptr;
  PyObject* value = nullptr;
  Py_ssize_t pos = 0;
  while (PyDict_Next(form.kwargs, &pos, &name, &value)) {
    int64_t named = -1;
    for (size_t i = first; i < frame_names_.size() && named < 0; ++i) {
      PyObject* parameter = frame_names_[i].ptr();
      if (name == parameter || (PyUnicode_Check(name) && PyUnicode_Compare(name, parameter) == 0)) {
        named = static_cast<int64_t>(i);
      }
    }
    if (PyErr_Occurred()) throw py::error_already_set();
    if (named < 0) return false;
    key->push_back(named);
  }
  return true;
}

bool DirectCall::guards_pass(PyObject* const* argv, size_t n, const CallForm& form,
                             py::dict* frame_out) {
  ++guard_checks_;
  py::dict& frame = *frame_out;
  if (varargs_) {
    // The frame as Python binds the call to (self, *args, **kwargs).
    if (!owner_local_.is_none()) frame[owner_local_] = py::handle(argv[0]);
    py::object args = py::reinterpret_borrow<py::object>(form.args);
    if (method_ && owner_local_.is_none()) {
      const Py_ssize_t given = PyTuple_GET_SIZE(form.args);
      args = py::reinterpret_steal<py::object>(PyTuple_New(given + 1));
      if (!args) throw py::error_already_set();
      Py_INCREF(argv[0]);
      PyTuple_SET_ITEM(args.ptr(), 0, argv[0]);
      for (Py_ssize_t i = 0; i < given; ++i) {
        PyObject* item = PyTuple_GET_ITEM(form.args, i);
        Py_INCREF(item);
        PyTuple_SET_ITEM(args.ptr(), i + 1, item);
      }
    }
    frame[args_local_] = args;
    if (!kwargs_local_.is_none()) {
      py::object keywords = py::reinterpret_steal<py::object>(
          form.kwargs != nullptr ? PyDict_Copy(form.kwargs) : PyDict_New());
      if (!keywords) throw py::error_already_set();
      frame[kwargs_local_] = keywords;
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      if (PyDict_SetItem(frame.ptr(), frame_names_[i].ptr(), argv[i]) < 0) {
        throw py::error_already_set();
      }
    }
  }
  for (const auto& [name, cell] : cells_) {
    PyObject* contents = PyCell_GET(cell.ptr());
    if (contents == nullptr) return false;  // an empty cell: the gather would fail too
    if (PyDict_SetItemString(frame.ptr(), name.c_str(), contents) < 0) {
      throw py::error_already_set();
    }
  }
  return check_frame(frame);
}

bool DirectCall::check_frame(const py::dict& frame) {
  PyObject* passed = PyObject_CallOneArg(guard_check_.ptr(), frame.ptr());
  if (passed == nullptr) throw py::error_already_set();
  const int truth = PyObject_IsTrue(passed);
  Py_DECREF(passed);
  if (truth < 0) throw py::error_already_set();
  return truth == 1;
}

DirectEntry::DirectEntry(py::object owner_ref)
    : owner_ref_(std::move(owner_ref)), epoch_(g_registration_epoch) {
  MAGI_ASSERT(owner_ref_.is_none() || PyWeakref_CheckRef(owner_ref_.ptr()),
              "DirectEntry: the owner must be a weak reference or None");
}

void DirectEntry::reset() {
  natives_.clear();
  epoch_ = g_registration_epoch;
}

DirectEntry DirectEntry::empty_copy() const {
  DirectEntry copy(owner_ref_);
  copy.epoch_ = g_registration_epoch;
  copy.names_ = names_;
  copy.defaults_ = defaults_;
  copy.var_keyword_ = var_keyword_;
  return copy;
}

void DirectEntry::set_parameters(const std::vector<std::string>& names, const py::list& defaults,
                                 const py::object& required, int64_t var_keyword) {
  MAGI_ASSERT(names.size() == defaults.size(), "DirectEntry: one default per parameter");
  names_.clear();
  defaults_.clear();
  for (size_t i = 0; i < names.size(); ++i) {
    names_.push_back(py::reinterpret_steal<py::str>(PyUnicode_InternFromString(names[i].c_str())));
    py::object value = defaults[i];
    defaults_.push_back(value.is(required) ? py::object() : std::move(value));
  }
  var_keyword_ = var_keyword;
}

py::object DirectEntry::call(const py::args& args, const py::kwargs& kwargs) {
  if (natives_.empty() || epoch_ != g_registration_epoch) return py::none();
  const size_t n = args.size();
  PyObject* const* given = n > 0 ? &PyTuple_GET_ITEM(args.ptr(), 0) : nullptr;
  c10::SmallVector<PyObject*, 8> argv;
  py::object owner;  // held through the call
  if (!owner_ref_.is_none()) {
    PyObject* alive = PyWeakref_GetObject(owner_ref_.ptr());  // borrowed
    if (alive == nullptr || alive == Py_None) return py::none();
    owner = py::reinterpret_borrow<py::object>(alive);
    argv.push_back(alive);
  }
  argv.append(given, given + n);
  py::dict extra;  // the **kwargs parameter's dict, held through the call
  if (!bind_rest(n, kwargs, &argv, &extra)) return py::none();
  const CallForm form{args.ptr(), kwargs ? kwargs.ptr() : nullptr};
  // The direct calls as of now, held: another thread may reset or extend this entry while
  // one of them runs (its guards run Python; its run releases the GIL).
  const c10::SmallVector<Native, 2> held(natives_.begin(), natives_.end());
  for (const Native& native : held) {
    py::object result = native.second->call_argv(argv.data(), argv.size(), form);
    if (!result.is_none()) {
      ++g_direct_calls;
      return result;
    }
  }
  return py::none();
}

bool DirectEntry::bind_rest(size_t n, const py::kwargs& kwargs,
                            c10::SmallVector<PyObject*, 8>* argv, py::dict* extra) const {
  const size_t given_kwargs = kwargs ? PyDict_GET_SIZE(kwargs.ptr()) : 0;
  if (names_.empty()) return given_kwargs == 0;
  if (n > names_.size()) return false;
  size_t used = 0;
  for (size_t i = 0; i < names_.size(); ++i) {
    if (static_cast<int64_t>(i) == var_keyword_) {
      argv->push_back(extra->ptr());  // filled below: the dict object stays the same
      continue;
    }
    PyObject* by_name =
        given_kwargs > 0 ? PyDict_GetItemWithError(kwargs.ptr(), names_[i].ptr()) : nullptr;
    if (by_name == nullptr && PyErr_Occurred()) throw py::error_already_set();
    if (i < n) {
      if (by_name != nullptr) return false;  // given twice: Python's TypeError
      continue;
    }
    if (by_name != nullptr) {
      argv->push_back(by_name);
      ++used;
    } else if (defaults_[i]) {
      argv->push_back(defaults_[i].ptr());
    } else {
      return false;  // a required argument is missing
    }
  }
  if (used == given_kwargs) return true;
  if (var_keyword_ < 0) return false;  // a keyword that names no parameter
  PyObject* key = nullptr;
  PyObject* value = nullptr;
  Py_ssize_t pos = 0;
  while (PyDict_Next(kwargs.ptr(), &pos, &key, &value)) {
    bool named = false;
    for (const py::str& name : names_) {
      if (PyUnicode_Compare(key, name.ptr()) == 0) {
        named = true;
        break;
      }
    }
    if (!named && PyDict_SetItem(extra->ptr(), key, value) < 0) throw py::error_already_set();
  }
  return true;
}

}  // namespace magi::bindings
