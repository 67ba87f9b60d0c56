// Direct calls in C++: the hot path of a captured inference signature (DESIGN §3.5).
//
// _fast_dispatch.py learns, from one observed ordinary call, where each input of the compiled
// graph comes from: an argument of the call, a size of one, or a parameter or buffer found in
// a module's `_parameters` / `_buffers` dict. A DirectCall holds that plan with the graph's
// runner, so a later call with positional arguments goes from the module's forward to the
// runtime without building Python lists: it checks the compact guard signature and Dynamo's
// guards of the cache entry the learning call ran, gathers the inputs (parameters and buffers
// from their dicts, as the Python gather does) and runs the CUDA graph runner (or the
// executable) with the GIL released. Any check that fails returns None, and the caller makes an
// ordinary call. With `memoize` (fast_dispatch_guards="arguments") Dynamo's guards run once per
// fingerprint of the arguments, the gathered parameters and the process state, and their
// verdict is reused; Python state outside those is then assumed fixed (docs/api.md). In the
// default mode the verdict is reused the same way while the Python state the guard tree reads
// is also unchanged: after each check that passed, _guard_watch.py lists that state (dict
// version tags with the objects at the keys read, identities, tensor layouts) and the call
// compares it, which costs far less than the tree; a tree it cannot list is evaluated on every
// call. When the traced frame is a `(self, *args, **kwargs)` wrapper around the forward the
// call binds to (_call_frame.py), the inputs and the signature come from the bound arguments
// while the guards run on a frame built from the call as Python made it (CallForm), and a
// reused verdict is keyed by the call's form too (how many positional arguments, which
// keywords in which order).
//
// A DirectEntry is what a compiled module's `forward` calls first: the direct calls learned
// for that module instance, tried in C++ without a Python frame between the module call and
// the runner. Each DirectCall remembers what the parameter and buffer dicts held at its last
// call, and re-reads a dict only when the dict changed since (its version tag, CPython 3.11
// and 3.12) or when the tensor it held changed layout.
#pragma once

#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include "bindings.h"
#include "guard_watch.h"

#include <c10/util/SmallVector.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "magi/common/error.h"
#include "magi/runtime/cuda_graph.h"
#include "magi/runtime/executor.h"
#include "magi/runtime/guard.h"

namespace magi::bindings {

/// Marks every direct call learned so far stale (a submodule they read through was replaced).
void bump_registration_epoch();
/// The number of registrations seen so far.
uint64_t registration_epoch();
/// Calls DirectEntry objects ran directly since the last reset.
uint64_t direct_entry_calls();
/// Sets direct_entry_calls() back to zero.
void reset_direct_entry_calls();

/// The steps from a module to the submodules whose parameter and buffer dicts direct calls
/// read: each a module, a name in its `_modules` dict and the submodule found there when the
/// call was learned. A submodule replaced (`model.layers[0] = other`) makes the held dicts
/// stale. Modules and submodules are held weakly, and the `_modules` dicts not at all (a child
/// may refer back to its parent, as a hook's bound method does: holding the dict would keep
/// the model alive through the direct call). Each module's `_modules` is reached through its
/// instance dict, which is read again only when that dict's version tag moved; the names in
/// `_modules` are looked up again only when its version tag moved.
class Routes {
 public:
  explicit Routes(const py::list& steps);

  /// True while every step still leads to the submodule it led to when learned.
  bool hold();

  size_t size() const { return size_; }

 private:
  struct Parent {
    Held module;
    PyObject* instance_dict = nullptr;  // as last seen, not held: the module holds it
    uint64_t instance_version = 0;
    PyObject* modules = nullptr;  // its `_modules`, not held: the instance dict holds it
    uint64_t modules_version = 0;
    std::vector<std::pair<py::object, Held>> children;  // name, the submodule there
  };
  std::vector<Parent> parents_;
  size_t size_ = 0;
};

/// A call as Python made it: the positional arguments after the owner (a tuple) and the
/// keywords (a dict, or nullptr for none). Borrowed.
struct CallForm {
  PyObject* args = nullptr;
  PyObject* kwargs = nullptr;
};

/// A learned direct call of one captured inference signature.
class DirectCall {
 public:
  DirectCall(py::object signature, py::object guard_check, std::vector<std::string> frame_names,
             std::vector<std::pair<std::string, py::object>> cells, py::object target,
             const py::list& slots, const std::string& result, bool method, bool memoize,
             py::object planner, py::object routes, py::object builder, py::object varargs,
             const std::vector<size_t>& through);

  size_t arity() const { return frame_names_.size(); }
  size_t num_guard_checks() const { return guard_checks_; }
  /// "arguments", "watched" (verdicts reused while the watched state holds), "unwatched"
  /// (the tree could not be listed: checked on every call) or "unplanned" (no check passed
  /// yet, or the state moved since the last).
  std::string guard_reuse() const {
    if (memoize_) return "arguments";
    if (planner_.is_none() || unwatchable_) return "unwatched";
    return watching_ ? "watched" : "unplanned";
  }

  /// The call's result, or None when this path does not apply to `args`, every parameter
  /// given positionally (the caller then makes an ordinary call).
  py::object call(const py::tuple& args);

  /// call() on the bound arguments `argv[0, n)`, borrowed; `form` is the call they were bound
  /// from, which the varargs form builds Dynamo's frame from.
  py::object call_argv(PyObject* const* argv, size_t n, const CallForm& form);

 private:
  enum class Result { kTensor, kTuple, kList, kCall };

  /// Where one graph input comes from.
  struct Slot {
    enum Kind { kArg, kSize, kItem, kFixed } kind = kArg;
    size_t arg = 0;   ///< kArg, kSize, kItem: index into the call's arguments
    int64_t dim = 0;  ///< kSize: which size of that argument; kItem: which item of that tuple
    py::object dict;  ///< kFixed: the module's _parameters or _buffers dict
    py::object key;   ///< kFixed: the name in it
    // kFixed, as of the last call: the object the dict held (borrowed: the dict keeps it alive
    // while its version tag stays the same), the tag then, and the held tensor's layout and
    // memory (`param.data = other` keeps the layout and moves the memory).
    PyObject* held = nullptr;
    uint64_t version = 0;
    TensorState state;
    const void* memory = nullptr;
  };

  /// Holds the call buffers for one call when no other call does. On the way out the
  /// arguments' graph inputs are dropped; the fixed ones are kept for the next call only when
  /// this one ran (a call that went back to the ordinary path keeps nothing: a parameter it
  /// no longer found, say, is not kept alive).
  struct Lease {
    explicit Lease(DirectCall* call) : self(call), owns(!call->buffers_busy_) {
      if (owns) self->buffers_busy_ = true;
    }
    ~Lease() {
      if (!owns) return;
      self->values_.clear();  // references to the arguments
      if (!ran) self->inputs_.clear();
      for (size_t i = 0; i < self->inputs_.size(); ++i) {
        if (!self->steady_[i]) self->inputs_[i] = c10::IValue();
      }
      self->buffers_busy_ = false;
    }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    DirectCall* self;
    bool owns;
    bool ran = false;  ///< the call reached the runner
  };

  /// A fixed input changed: a new generation, and the verdicts of earlier ones can never be
  /// reused (their fingerprints carry an older generation), so they are dropped.
  void next_generation();

  /// The tensor `slot`'s dict holds now (borrowed), or nullptr when it holds none. The dict is
  /// read again only when its version tag moved; a tensor other than last call's, or the
  /// same one with another layout, starts a new generation of the fixed inputs.
  PyObject* fixed_input(Slot& slot);

  /// The watched state moved: every verdict is dropped. A watch that keeps failing soon after
  /// it was listed (state that moves on every call, such as a counter attribute the guards
  /// compare) costs a walk of the tree each time: after kMaxQuickFailures in a row the tree
  /// is evaluated on every call instead.
  void forget_watch();
  /// Asks the planner what the guard tree just passed on `frame` reads; a tree it cannot
  /// list is evaluated on every call from now on.
  /// Returns false when a dict this call gathers parameters or buffers from is no longer the
  /// one the frame reaches (a submodule replaced in a way Routes did not see): every direct
  /// call is then dropped, and this call is made ordinarily.
  bool start_watching(const py::dict& frame);
  bool guards_pass(PyObject* const* argv, size_t n, const CallForm& form, py::dict* frame_out);
  /// Appends the call's form (varargs frames): the number of positional arguments and, in
  /// order, the parameter each keyword names; false for a keyword that names none.
  bool append_form(const CallForm& form, std::vector<int64_t>* key) const;
  /// Dynamo's guards on the frame's locals.
  bool check_frame(const py::dict& frame);

  py::object signature_obj_;  // keeps signature_ alive
  const runtime::GuardSignature* signature_ = nullptr;
  py::object guard_check_;
  std::vector<py::str> frame_names_;
  std::vector<std::pair<std::string, py::object>> cells_;
  // The varargs form (_call_frame.py): Dynamo's frame holds the call's positional arguments
  // after the owner as a tuple and a copy of its keywords as a dict, under these names, and
  // the owner under owner_local_ (None: as the tuple's first item). Else the frame holds the
  // bound arguments under frame_names_.
  bool varargs_ = false;
  py::object owner_local_;
  py::object args_local_;
  py::object kwargs_local_;  // None: the frame takes no keywords
  py::object target_;        // keeps the runner or executable alive
  py::object planner_;       // _guard_watch.planner's callable, or None
  py::object routes_obj_;    // keeps routes_ alive (None: no submodules to check)
  Routes* routes_ = nullptr;
  py::object builder_;  // Result::kCall: builds the result from the output list
  // Per graph input, its place among the inputs the builder takes after the outputs (inputs
  // the result returns as they came in), or -1.
  std::vector<int> through_at_;
  size_t num_through_ = 0;
  std::shared_ptr<Watch> watch_;  // replaced whole, never changed in place but for versions
  bool watching_ = false;
  size_t calls_ = 0;           // calls that ran directly
  size_t listed_at_ = 0;       // calls_ when watch_ was listed
  size_t quick_failures_ = 0;  // watches in a row that failed within kQuickCalls calls
                               // (watch_ lists the state of the verdicts in verified_)
  bool unwatchable_ = false;   // the planner could not list the tree: check every call
  runtime::CudaGraphRunner* runner_ = nullptr;
  const runtime::Executable* executable_ = nullptr;
  std::vector<Slot> slots_;
  std::vector<bool> steady_;  // per graph input: a fixed one (runtime::SteadyInputs)
  Result result_ = Result::kTensor;
  bool method_ = false;
  bool memoize_ = false;
  std::set<std::vector<int64_t>> verified_;  // fingerprints Dynamo's guards passed
  std::vector<int64_t> last_verified_;       // the last call's, when it passed
  std::vector<int64_t> key_buffer_;
  std::vector<runtime::GuardInput> values_;  // the signature's inputs, empty between calls
  // The graph inputs a runner borrows: the fixed ones (parameters, buffers) kept from one call
  // that ran to the next, the others None between calls. The kept ones are alive while this
  // direct call is, as a captured graph's own static inputs are while its runner is.
  std::vector<c10::IValue> inputs_;
  bool buffers_busy_ = false;      // values_ and key_buffer_ are held by a call
  uint64_t fixed_generation_ = 0;  // a new g_fixed_generations when a fixed input changes
  size_t guard_checks_ = 0;
};

/// The direct calls learned for one module instance's compiled method (or one function), as
/// its Python wrapper calls them: `entry(args)` tries each in C++ and returns the first
/// result, or None (the wrapper then makes the ordinary call). The owner is held weakly.
class DirectEntry {
 public:
  explicit DirectEntry(py::object owner_ref);

  /// Forgets every direct call; later ones are learned in the current epoch.
  void reset();

  void add(const py::object& native) { natives_.emplace_back(native, native.cast<DirectCall*>()); }

  size_t size() const { return natives_.size(); }

  DirectEntry empty_copy() const;

  /// How a call's keyword arguments and left-out arguments map to the compiled function's
  /// parameters (after the owner): their names, their defaults (`required` where there is
  /// none) and the position of a `**kwargs` parameter (-1: none). Without it, only calls that
  /// pass every parameter positionally are tried.
  void set_parameters(const std::vector<std::string>& names, const py::list& defaults,
                      const py::object& required, int64_t var_keyword);

  py::object call(const py::args& args, const py::kwargs& kwargs);

 private:
  /// Appends to `argv` the parameters after the `n` given positionally: from `kwargs` by
  /// name, else their defaults, and keywords that name no parameter in `extra` for a
  /// `**kwargs` parameter. False when the call does not bind (Python would raise, or no
  /// parameter layout is known): the ordinary call then handles it.
  bool bind_rest(size_t n, const py::kwargs& kwargs, c10::SmallVector<PyObject*, 8>* argv,
                 py::dict* extra) const;

  using Native = std::pair<py::object, DirectCall*>;  // the object keeps the pointer valid
  py::object owner_ref_;
  std::vector<Native> natives_;
  uint64_t epoch_ = 0;
  std::vector<py::str> names_;        // parameters after the owner; empty: positional only
  std::vector<py::object> defaults_;  // per parameter, its default (null: none)
  int64_t var_keyword_ = -1;          // index of the **kwargs parameter in names_
};

}  // namespace magi::bindings
