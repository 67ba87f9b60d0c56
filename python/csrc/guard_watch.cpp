// Watch: the per-call comparison of the state a Dynamo guard tree reads (guard_watch.h).
#include "guard_watch.h"

#include <ATen/SavedTensorHooks.h>

namespace magi::bindings {
namespace {

#ifdef MAGI_DICT_WATCHERS
// CPython 3.12's dict watchers: every dict a watch lists is registered with one watcher, whose
// callback counts writes to any of them. A call that finds the count unchanged skips reading
// the dicts (about 90 for the 4-layer stack, mostly out of cache on a busy host); otherwise it
// compares them as on 3.11. GIL-protected, as the callback runs with the GIL held.
uint64_t g_watched_writes = 0;

int count_watched_write(PyDict_WatchEvent, PyObject*, PyObject*, PyObject*) {
  ++g_watched_writes;
  return 0;
}

/// The watcher's id, registered at first use; -1 when the interpreter has no free slot.
int dict_watcher() {
  static const int id = [] {
    const int got = PyDict_AddWatcher(count_watched_write);
    if (got < 0) PyErr_Clear();
    return got;
  }();
  return id;
}
#endif

/// The version tag of `type`, assigned if it has none yet; 0 when CPython cannot give one.
unsigned int type_version(PyTypeObject* type) {
#if PY_VERSION_HEX >= 0x030C0000
  PyUnstable_Type_AssignVersionTag(type);
#else
  static PyObject* const probe = PyUnicode_InternFromString("__magi_version_probe__");
  _PyType_Lookup(type, probe);  // assigns a tag as a side effect of the cached lookup
#endif
  return type->tp_version_tag;
}

}  // namespace

Held Held::of(py::handle obj) {
  Held h;
  PyObject* ref = PyWeakref_NewRef(obj.ptr(), nullptr);
  if (ref != nullptr) {
    h.ref = py::reinterpret_steal<py::object>(ref);
    h.weak = true;
  } else if (PyErr_ExceptionMatches(PyExc_TypeError)) {  // takes no weak references
    PyErr_Clear();
    h.ref = py::reinterpret_borrow<py::object>(obj);
  } else {
    throw py::error_already_set();
  }
  return h;
}

bool Watch::load(const py::tuple& plan) {
#ifdef MAGI_DICT_WATCHERS
  watched = dict_watcher() >= 0;
#endif
  for (py::handle item : plan[0].cast<py::list>()) {
    const py::tuple pair = py::reinterpret_borrow<py::tuple>(item);
    Dict d;
    d.how = pair[2].cast<int>();
    if (d.how == kThroughHolder) {
      d.holder = Held::of(pair[0]);
      d.seen = instance_dict(pair[0].ptr());
      if (d.seen == nullptr) return false;
    } else if (d.how == kAtKey) {
      d.seen = pair[0].ptr();
    } else {
      d.dict = py::reinterpret_borrow<py::object>(pair[0]);
    }
    PyObject* dict = d.get();
#ifdef MAGI_DICT_WATCHERS
    // Registered before its version is read: registering sets bits of the version tag.
    if (watched && PyDict_Watch(dict_watcher(), dict) < 0) {
      PyErr_Clear();
      watched = false;
    }
#endif
    d.version = dict_version(dict);
    if (d.version == 0) return false;
    d.whole = pair[1].is_none();
    if (!d.whole) {
      for (py::handle key : pair[1].cast<py::list>()) {
        PyObject* now = PyDict_GetItemWithError(dict, key.ptr());
        if (now == nullptr && PyErr_Occurred()) throw py::error_already_set();
        Key k;
        k.key = py::reinterpret_borrow<py::object>(key);
        k.missing = now == nullptr;
        if (now != nullptr && PyDict_Check(now)) {
          k.dict = now;
        } else if (now != nullptr) {
          k.value = Held::of(now);
        }
        d.keys.push_back(std::move(k));
      }
    }
    dicts.push_back(std::move(d));
  }
  for (py::handle item : plan[1].cast<py::list>()) {
    const py::tuple t = py::reinterpret_borrow<py::tuple>(item);
    Pin pin;
    pin.kind = t[0].cast<int>();
    if (pin.kind == kCell) pin.cell = py::reinterpret_borrow<py::object>(t[1]);
    pin.obj = t[1].ptr();
    pin.expected = t[2].ptr();
    pin.expected_ref = Held::of(t[2]);
    if (pin.kind == kTypeUnchanged) {
      pin.type_version = type_version(Py_TYPE(pin.obj));
      if (pin.type_version == 0) return false;
    }
    pins.push_back(std::move(pin));
  }
  for (py::handle item : plan[2].cast<py::list>()) {
    if (!THPVariable_Check(item.ptr())) return false;
    TensorState state;
    state.take(THPVariable_Unpack(item.ptr()), Py_TYPE(item.ptr()));
    tensors.emplace_back(Held::of(item), std::move(state));
  }
  for (py::handle item : plan[3].cast<py::list>()) {
    const py::tuple t = py::reinterpret_borrow<py::tuple>(item);
    Absent a;
    a.arg = t[1].cast<int64_t>();
    if (a.arg < 0) a.obj = Held::of(t[0]);
    a.name = py::reinterpret_borrow<py::object>(t[2]);
    absent.push_back(std::move(a));
  }
  saved_hooks = plan[4].cast<bool>();
  const py::tuple distinct = plan[5].cast<py::tuple>();
  distinct_args = distinct[0].cast<std::vector<int64_t>>();
  for (py::handle t : distinct[1].cast<py::list>()) distinct_tensors.push_back(Held::of(t));
  for (py::handle item : plan[6].cast<py::list>()) {
    const py::tuple t = py::reinterpret_borrow<py::tuple>(item);
    Reread r;
    r.obj = Held::of(t[0]);
    r.name = py::reinterpret_borrow<py::object>(t[1]);
    r.expected = py::reinterpret_borrow<py::object>(t[2]);
    r.generic = t[3].cast<bool>();
    reread.push_back(std::move(r));
  }
#ifdef MAGI_DICT_WATCHERS
  writes_seen = g_watched_writes;
#endif
  return true;
}

bool Watch::holds(PyObject* const* argv, size_t n) {
  if (!dicts_unwritten()) {
    if (!dicts_hold()) return false;
#ifdef MAGI_DICT_WATCHERS
    writes_seen = g_watched_writes;
#endif
  }
  return rest_holds(argv, n);
}

/// True when no watched dict was written since they last held (dict watchers), so that
/// reading them is not needed.
bool Watch::dicts_unwritten() const {
#ifdef MAGI_DICT_WATCHERS
  return watched && writes_seen == g_watched_writes;
#else
  return false;
#endif
}

bool Watch::dicts_hold() {
  for (Dict& d : dicts) {
    PyObject* dict = d.get();
    if (dict == nullptr) return false;
    const uint64_t version = dict_version(dict);
    if (version == d.version) continue;
    if (d.whole || version == 0) return false;
    for (const Key& k : d.keys) {
      PyObject* now = PyDict_GetItemWithError(dict, k.key.ptr());
      if (now == nullptr && PyErr_Occurred()) throw py::error_already_set();
      if (!k.same(now)) return false;
    }
    d.version = version;
  }
  return true;
}

bool Watch::rest_holds(PyObject* const* argv, size_t n) const {
  for (const Pin& pin : pins) {
    if (pin.expected_ref.weak && pin.expected_ref.get() == nullptr) return false;
    PyObject* now = nullptr;
    if (pin.kind == kCode) {
      now = PyFunction_GET_CODE(pin.obj);
    } else if (pin.kind == kKwDefaults) {
      now = PyFunction_GET_KW_DEFAULTS(pin.obj);  // reassignable: `f.__kwdefaults__ = {...}`
    } else if (pin.kind == kType || pin.kind == kTypeUnchanged) {
      now = reinterpret_cast<PyObject*>(Py_TYPE(pin.obj));
    } else {
      now = PyCell_GET(pin.obj);
    }
    if (now != pin.expected) return false;
    if (pin.kind == kTypeUnchanged && Py_TYPE(pin.obj)->tp_version_tag != pin.type_version) {
      return false;
    }
  }
  for (const auto& [held, state] : tensors) {
    PyObject* obj = held.get();
    if (obj == nullptr || !state.same(THPVariable_Unpack(obj), Py_TYPE(obj))) return false;
  }
  for (const Absent& a : absent) {
    PyObject* obj =
        a.arg >= 0 ? (static_cast<size_t>(a.arg) < n ? argv[a.arg] : nullptr) : a.obj.get();
    if (obj == nullptr || PyObject_HasAttr(obj, a.name.ptr()) != 0) return false;
  }
  for (const Reread& r : reread) {
    PyObject* obj = r.obj.get();
    if (obj == nullptr) return false;
    PyObject* now = r.generic ? PyObject_GenericGetAttr(obj, r.name.ptr())
                              : PyObject_GetAttr(obj, r.name.ptr());
    if (now == nullptr) {
      PyErr_Clear();  // the guards decide what a failing read means
      return false;
    }
    int same = Py_TYPE(now) == Py_TYPE(r.expected.ptr())
                   ? PyObject_RichCompareBool(now, r.expected.ptr(), Py_EQ)
                   : 0;
    Py_DECREF(now);
    if (same < 0) {
      PyErr_Clear();
      same = 0;
    }
    if (same != 1) return false;
  }
  for (const int64_t i : distinct_args) {
    if (i < 0 || static_cast<size_t>(i) >= n) return false;
    for (const Held& t : distinct_tensors) {
      if (t.get() == argv[i]) return false;
    }
  }
  return true;
}

}  // namespace magi::bindings
