// The Python state a Dynamo guard tree reads, as the direct calls of bind_dispatch.cpp watch
// it (fast_dispatch_guards="dynamo", docs/api.md "How often the guards run"):
// _guard_watch.py lists it after a check that passed, Watch::load takes the list, and
// Watch::holds tells each later call whether it is unchanged, in which case the tree decides
// as it did. Also what the direct calls compare of tensors (TensorState) and dicts.
#pragma once

#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include "bindings.h"

#include <c10/util/SmallVector.h>

#include <cstdint>
#include <utility>
#include <vector>

// CPython 3.12's dict watchers (guard_watch.cpp).
#if PY_VERSION_HEX >= 0x030C0000 && PY_VERSION_HEX < 0x030D0000 && !defined(Py_LIMITED_API) && \
    !defined(Py_GIL_DISABLED)
#define MAGI_DICT_WATCHERS 1
#endif

namespace magi::bindings {

/// The version tag of `dict`, which CPython changes on every write to it; 0 where the tag is
/// not available (the caller then looks the key up on every call).
inline uint64_t dict_version(PyObject* dict) {
#if PY_VERSION_HEX < 0x030D0000 && !defined(Py_LIMITED_API) && !defined(Py_GIL_DISABLED)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  return reinterpret_cast<PyDictObject*>(dict)->ma_version_tag;
#pragma GCC diagnostic pop
#else
  (void)dict;
  return 0;
#endif
}

/// What Dynamo's tensor guards compare of a parameter or buffer, kept from one call to the
/// next: a call whose fixed inputs all compare equal needs none of them in its fingerprint.
struct TensorState {
  const c10::TensorImpl* impl = nullptr;
  PyTypeObject* type = nullptr;
  uint64_t keys = 0;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  c10::Device device = c10::Device(c10::DeviceType::CPU);
  bool requires_grad = false;
  int64_t offset = 0;
  c10::SmallVector<int64_t, 6> sizes;
  c10::SmallVector<int64_t, 6> strides;

  bool same(const at::Tensor& t, PyTypeObject* t_type) const {
    return t.unsafeGetTensorImpl() == impl && t_type == type && t.key_set().raw_repr() == keys &&
           t.scalar_type() == dtype && t.device() == device && t.requires_grad() == requires_grad &&
           t.storage_offset() == offset && t.sizes().equals(sizes) && t.strides().equals(strides);
  }
  void take(const at::Tensor& t, PyTypeObject* t_type) {
    impl = t.unsafeGetTensorImpl();
    type = t_type;
    keys = t.key_set().raw_repr();
    dtype = t.scalar_type();
    device = t.device();
    requires_grad = t.requires_grad();
    offset = t.storage_offset();
    sizes.assign(t.sizes().begin(), t.sizes().end());
    strides.assign(t.strides().begin(), t.strides().end());
  }
};

/// An object a watch compares by identity, held without keeping it alive where it takes a
/// weak reference (modules, functions, tensors: a module tree must stay freeable while its
/// direct calls exist), else held strongly (dicts, ints, strings): either way a later
/// identity test cannot meet a new object at a freed one's address.
struct Held {
  py::object ref;
  bool weak = false;

  /// Holds `obj` weakly where it takes a weak reference, else strongly.
  static Held of(py::handle obj);
  /// The object (borrowed), or nullptr once it was freed.
  PyObject* get() const {
    if (!weak) return ref.ptr();
    PyObject* obj = PyWeakref_GetObject(ref.ptr());
    return obj == Py_None ? nullptr : obj;
  }
};

/// The instance dict of `obj` (borrowed), or nullptr when it has none.
inline PyObject* instance_dict(PyObject* obj) {
  PyObject** slot = _PyObject_GetDictPtr(obj);
  return slot == nullptr ? nullptr : *slot;
}

/// Python state a Dynamo guard tree reads, as _guard_watch.plan lists it: unchanged, the tree
/// decides as it did at the last check (for the same fingerprint of arguments and process
/// state).
struct Watch {
  struct Key {
    py::object key;
    Held value;                ///< the object the dict held at the key, unless a dict
    PyObject* dict = nullptr;  ///< that object when a dict: compared, not held (below)
    bool missing = false;      ///< the key was absent

    bool same(PyObject* now) const {
      if (missing) return now == nullptr;
      if (now == nullptr) return false;
      return dict != nullptr ? now == dict : now == value.get();
    }
  };
  // How a listed dict is held (_guard_watch.HELD_DICT, THROUGH_HOLDER, AT_KEY). Dicts take no
  // weak references, and holding the dicts of a module tree would keep it alive: a module's
  // __dict__ holds its compiled forward, whose closure holds the module, and its _modules may
  // hold a child whose hooks hold the parent. So only roots (the globals) are held. An
  // instance's or Python module's __dict__ is reached through its object, held weakly; a dict
  // found at a key of a dict listed before it is compared by address and version without
  // being held: the earlier dict's check proves it still holds that very dict (alive) before
  // this one is read, and a new dict at a freed one's address has another version.
  enum How { kHeld = 0, kThroughHolder = 1, kAtKey = 2 };
  struct Dict {
    int how = kHeld;
    py::object dict;           ///< kHeld
    Held holder;               ///< kThroughHolder: the object whose __dict__ it is
    PyObject* seen = nullptr;  ///< kThroughHolder, kAtKey: the dict when listed
    uint64_t version = 0;
    bool whole = false;  ///< its keys or size are read: any write counts
    std::vector<Key> keys;

    /// The dict now (borrowed), or nullptr when its holder is gone or has another __dict__.
    PyObject* get() const {
      if (how == kHeld) return dict.ptr();
      if (how == kAtKey) return PyDict_Check(seen) ? seen : nullptr;
      PyObject* obj = holder.get();
      if (obj == nullptr) return nullptr;
      PyObject* now = instance_dict(obj);
      return now == seen ? now : nullptr;
    }
  };
  enum PinKind { kCode = 0, kType = 1, kCell = 2, kTypeUnchanged = 3, kKwDefaults = 4 };
  // An identity pin's object is alive whenever the pins are compared: a function or an
  // object found at a key of a listed dict, or in a tuple found there, that the dicts' checks
  // (run first) proved unchanged, or among the attributes of a class an earlier kTypeUnchanged
  // pin proved unchanged; the owner of the call; or a closure cell, held. The expected object
  // (a __code__, __kwdefaults__, type or cell's contents) is compared by address and held weakly
  // where it can be, so its death is checked too: a new object at its address (a cell assigned
  // twice between calls) must not pass for it. kTypeUnchanged also compares the type's version tag,
  // which CPython changes whenever the class or a base is modified (an attribute read through
  // an instance's __dict__ stays so only while no property or __getattribute__ is added).
  struct Pin {
    int kind = kCode;
    py::object cell;               ///< kCell: the cell, held
    PyObject* obj = nullptr;       ///< the function, object or cell
    PyObject* expected = nullptr;  ///< its __code__, type or contents when listed
    Held expected_ref;
    unsigned int type_version = 0;  ///< kTypeUnchanged: the type's version tag when listed
  };
  struct Absent {  ///< an attribute a guard says an object (or argument) lacks
    Held obj;
    int64_t arg = -1;  ///< or the call's argument at this index
    py::object name;
  };
  std::vector<Dict> dicts;
  std::vector<Pin> pins;
  std::vector<std::pair<Held, TensorState>> tensors;
  std::vector<Absent> absent;
  /// An attribute whose value a property computes (a config's `output_attentions`): read on
  /// every call, as Dynamo's guard reads it, and compared with the immutable value the guards
  /// passed on.
  struct Reread {
    Held obj;
    py::object name;
    py::object expected;
    bool generic = false;  ///< read as object.__getattribute__ does, not getattr
  };
  std::vector<Reread> reread;
  /// Dynamo's NO_TENSOR_ALIASING guard: none of these arguments may be any of these tensors.
  std::vector<int64_t> distinct_args;
  std::vector<Held> distinct_tensors;
  /// Dynamo's root lambda on saved-tensor hooks: with hooks set, each call checks the guards
  /// (whether they are ones its lambda accepts is Python's to say) and keeps the watch.
  bool saved_hooks = false;
#ifdef MAGI_DICT_WATCHERS
  bool watched = false;      ///< every dict is registered with the dict watcher
  uint64_t writes_seen = 0;  ///< g_watched_writes when the dicts last held
#endif

  /// Loads _guard_watch.plan's tuple; false when a dict has no version tag to compare.
  bool load(const py::tuple& plan);

  /// Whether everything listed is as it was. Dicts come first: a dict that moved is read
  /// again at its keys and, when they hold the same objects, taken at its new version.
  bool holds(PyObject* const* argv, size_t n);

 private:
  bool dicts_unwritten() const;
  bool dicts_hold();
  bool rest_holds(PyObject* const* argv, size_t n) const;
};

}  // namespace magi::bindings
