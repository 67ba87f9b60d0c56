// FX -> IR importer. See fx_import.h for the contract.
#include "fx_import.h"

#include <ATen/EmptyTensor.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Layout.h>
#include <torch/csrc/MemoryFormat.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <unordered_map>

#include "magi/common/error.h"
#include "magi/common/log.h"

namespace magi::bindings {
namespace py = pybind11;
namespace {

std::string py_str(py::handle h) { return py::str(h).cast<std::string>(); }

std::string type_name(py::handle h) {
  return py::str(py::type::handle_of(h).attr("__name__")).cast<std::string>();
}

/// sympy expression (from a SymInt's node.expr) -> SymExpr. Unknown functions become an
/// opaque symbol named by their text, so nothing is lost, only not simplified.
ir::SymExpr from_sympy(py::handle e) {
  const std::string kind = type_name(e);
  py::tuple args = e.attr("args");
  auto fold = [&](auto combine) {
    ir::SymExpr acc = from_sympy(args[0]);
    for (size_t i = 1; i < args.size(); ++i) acc = combine(acc, from_sympy(args[i]));
    return acc;
  };
  if (kind == "Integer" || kind == "Zero" || kind == "One" || kind == "NegativeOne" ||
      kind == "IntegerConstant" || kind == "int") {
    return ir::SymExpr(py::int_(py::reinterpret_borrow<py::object>(e)).cast<int64_t>());
  }
  if (kind == "Symbol") return ir::SymExpr::symbol(py_str(e));
  if (kind == "Add") return fold([](const ir::SymExpr& a, const ir::SymExpr& b) { return a + b; });
  if (kind == "Mul") return fold([](const ir::SymExpr& a, const ir::SymExpr& b) { return a * b; });
  if (kind == "FloorDiv") return floor_div(from_sympy(args[0]), from_sympy(args[1]));
  if (kind == "Mod" || kind == "PythonMod") return mod(from_sympy(args[0]), from_sympy(args[1]));
  if (kind == "Max")
    return fold([](const ir::SymExpr& a, const ir::SymExpr& b) { return max(a, b); });
  if (kind == "Min")
    return fold([](const ir::SymExpr& a, const ir::SymExpr& b) { return min(a, b); });
  if (kind == "Pow" && type_name(args[1]) == "Integer") {
    int64_t n = py::int_(py::reinterpret_borrow<py::object>(args[1])).cast<int64_t>();
    if (n >= 0 && n <= 8) {
      ir::SymExpr base = from_sympy(args[0]), acc(1);
      for (int64_t i = 0; i < n; ++i) acc = acc * base;
      return acc;
    }
  }
  return ir::SymExpr::symbol(py_str(e));
}

class FxImporter {
 public:
  FxImporter()
      : torch_(py::module_::import("torch")),
        fx_node_type_(py::module_::import("torch.fx").attr("Node")),
        op_overload_type_(py::module_::import("torch._ops").attr("OpOverload")),
        hop_type_(py::module_::import("torch._ops").attr("HigherOrderOperator")),
        sym_int_type_(torch_.attr("SymInt")),
        sym_float_type_(torch_.attr("SymFloat")),
        sym_bool_type_(torch_.attr("SymBool")) {
    py::module_ op = py::module_::import("operator");
    auto add = [&](py::object fn, ir::SymOp sym) { python_sym_ops_[fn.ptr()] = {fn, sym}; };
    add(op.attr("add"), ir::SymOp::kAdd);
    add(op.attr("sub"), ir::SymOp::kSub);
    add(op.attr("mul"), ir::SymOp::kMul);
    add(op.attr("floordiv"), ir::SymOp::kFloorDiv);
    add(op.attr("mod"), ir::SymOp::kMod);
    add(op.attr("truediv"), ir::SymOp::kTrueDiv);
    add(op.attr("neg"), ir::SymOp::kNeg);
    add(op.attr("eq"), ir::SymOp::kEq);
    add(op.attr("ne"), ir::SymOp::kNe);
    add(op.attr("lt"), ir::SymOp::kLt);
    add(op.attr("le"), ir::SymOp::kLe);
    add(op.attr("gt"), ir::SymOp::kGt);
    add(op.attr("ge"), ir::SymOp::kGe);
    add(torch_.attr("sym_max"), ir::SymOp::kMax);
    add(torch_.attr("sym_min"), ir::SymOp::kMin);
    getitem_ = op.attr("getitem");
    sym_sum_ = torch_.attr("sym_sum");
  }

  std::unique_ptr<ir::Graph> run(py::handle gm) {
    graph_ = std::make_unique<ir::Graph>();
    gm_ = gm;
    // Materialise the node list: iterating FX's node view through a pybind accessor
    // temporary can restart the iteration.
    py::list fx_nodes(gm.attr("graph").attr("nodes"));
    for (py::handle node : fx_nodes) {
      current_ = node;
      const std::string op = node.attr("op").cast<std::string>();
      if (op == "placeholder") {
        import_placeholder(node);
      } else if (op == "call_function") {
        import_call(node);
      } else if (op == "get_attr") {
        import_get_attr(node);
      } else if (op == "output") {
        import_output(node);
      } else {
        MAGI_UNSUPPORTED("FX node '", py_str(node.attr("name")), "' is a ", op,
                         "; the importer takes ATen-level graphs (from AOTAutograd), which have "
                         "only placeholder, call_function, get_attr and output nodes");
      }
    }
    MAGI_ASSERT(graph_->output_node() != nullptr, "FX graph without an output node");
    return std::move(graph_);
  }

 private:
  // --- values -----------------------------------------------------------------------------
  ir::Value* lookup(py::handle fx_node) {
    auto it = env_.find(fx_node.ptr());
    MAGI_ASSERT(it != env_.end(), "FX node ", py_str(fx_node.attr("name")),
                " used before it was imported");
    MAGI_ASSERT(it->second.size() == 1, "FX node ", py_str(fx_node.attr("name")), " has ",
                it->second.size(), " outputs; it must be read through getitem");
    return it->second.front();
  }

  bool is_fx_node(py::handle h) const { return py::isinstance(h, fx_node_type_); }

  ir::Value* constant(c10::IValue v, ir::ValueKind kind) {
    return graph_->add_constant(std::move(v), kind);
  }

  // Converts an FX argument to a Value. `expected` is the schema type (null when unknown).
  ir::Value* convert(py::handle a, const c10::TypePtr& expected) {
    using ir::ValueKind;
    ValueKind want = expected ? ir::value_kind_of(expected) : ValueKind::kOther;
    if (want == ValueKind::kTensor) {
      // None for a non-optional Tensor parameter is an undefined tensor, as in PyTorch's own
      // Python -> IValue conversion (AOTAutograd passes one as attn_bias of
      // aten::_scaled_dot_product_efficient_attention_backward).
      if (a.is_none() && expected->kind() == c10::TypeKind::TensorType) {
        return constant(c10::IValue(at::Tensor()), ValueKind::kTensor);
      }
      // FX passes Python numbers to Tensor parameters (aten::add.Tensor(x, 1e-6)); eager's
      // argument parser turns them into 0-dim "wrapped number" tensors, which take no part
      // in type promotion. Do the same, at import time for literals, at run time for sizes.
      if (!is_fx_node(a) && (py::isinstance<py::int_>(a) || py::isinstance<py::float_>(a))) {
        return constant(wrapped_number(a), ValueKind::kTensor);
      }
      if (is_fx_node(a)) {
        ir::Value* v = lookup(a);
        if (v->kind() == ValueKind::kInt || v->kind() == ValueKind::kFloat) return scalar_tensor(v);
        return v;
      }
    }
    if (is_fx_node(a)) return lookup(a);
    if (a.is_none()) return constant(c10::IValue(), ValueKind::kNone);
    if (py::isinstance<py::bool_>(a)) return constant(a.cast<bool>(), ValueKind::kBool);
    if (py::isinstance<py::int_>(a)) {
      int64_t x = a.cast<int64_t>();
      if (want == ValueKind::kFloat) return constant(static_cast<double>(x), ValueKind::kFloat);
      if (want == ValueKind::kDtype || want == ValueKind::kLayout ||
          want == ValueKind::kMemoryFormat) {
        return constant(x, want);
      }
      return constant(x, ValueKind::kInt);
    }
    if (py::isinstance<py::float_>(a)) return constant(a.cast<double>(), ValueKind::kFloat);
    if (py::isinstance<py::str>(a)) return constant(a.cast<std::string>(), ValueKind::kString);
    PyObject* obj = a.ptr();
    if (THPDtype_Check(obj)) {
      auto t = reinterpret_cast<THPDtype*>(obj)->scalar_type;
      return constant(static_cast<int64_t>(t), ValueKind::kDtype);
    }
    if (THPDevice_Check(obj)) {
      return constant(reinterpret_cast<THPDevice*>(obj)->device, ValueKind::kDevice);
    }
    if (THPLayout_Check(obj)) {
      return constant(static_cast<int64_t>(reinterpret_cast<THPLayout*>(obj)->layout),
                      ValueKind::kLayout);
    }
    if (THPMemoryFormat_Check(obj)) {
      return constant(static_cast<int64_t>(reinterpret_cast<THPMemoryFormat*>(obj)->memory_format),
                      ValueKind::kMemoryFormat);
    }
    if (THPVariable_Check(obj)) return constant(THPVariable_Unpack(obj), ValueKind::kTensor);
    if (py::isinstance<py::list>(a) || py::isinstance<py::tuple>(a))
      return convert_list(a, expected);
    MAGI_UNSUPPORTED("cannot import argument ", py::repr(a).cast<std::string>(), " of type ",
                     type_name(a), " in FX node '", py_str(current_.attr("name")), "'");
    return nullptr;
  }

  // Built with empty_cpu and a raw store, not through the dispatcher: the importer runs
  // while AOTAutograd's FakeTensorMode may still be active, which would make a fake tensor.
  static at::Tensor wrapped_number(py::handle a) {
    at::Tensor t;
    if (py::isinstance<py::bool_>(a)) {
      t = at::detail::empty_cpu({}, at::kBool, std::nullopt, std::nullopt, std::nullopt,
                                std::nullopt);
      *t.mutable_data_ptr<bool>() = a.cast<bool>();
    } else if (py::isinstance<py::int_>(a)) {
      t = at::detail::empty_cpu({}, at::kLong, std::nullopt, std::nullopt, std::nullopt,
                                std::nullopt);
      *t.mutable_data_ptr<int64_t>() = a.cast<int64_t>();
    } else {
      t = at::detail::empty_cpu({}, at::kDouble, std::nullopt, std::nullopt, std::nullopt,
                                std::nullopt);
      *t.mutable_data_ptr<double>() = a.cast<double>();
    }
    t.unsafeGetTensorImpl()->set_wrapped_number(true);
    return t;
  }

  // A symbolic int or float read as a Tensor argument: aten::scalar_tensor at run time.
  ir::Value* scalar_tensor(ir::Value* number) {
    static const auto op =
        c10::Dispatcher::singleton().findSchemaOrThrow("aten::scalar_tensor", "");
    bool is_int = number->kind() == ir::ValueKind::kInt;
    std::vector<ir::Value*> inputs = {
        number,
        constant(static_cast<int64_t>(is_int ? at::kLong : at::kDouble), ir::ValueKind::kDtype),
        constant(c10::IValue(), ir::ValueKind::kNone),
        constant(c10::IValue(), ir::ValueKind::kNone),
        constant(c10::IValue(), ir::ValueKind::kNone)};
    ir::Node* n = graph_->add_op(op, std::move(inputs));
    set_provenance(n, current_);
    return n->output();
  }

  ir::Value* convert_list(py::handle a, const c10::TypePtr& expected) {
    using ir::ValueKind;
    py::sequence items = py::reinterpret_borrow<py::sequence>(a);
    ValueKind kind = expected ? ir::value_kind_of(expected) : ValueKind::kOther;
    c10::TypePtr elem_type;
    if (expected) {
      c10::TypePtr t = expected;
      if (t->kind() == c10::TypeKind::OptionalType) {
        t = t->castRaw<c10::OptionalType>()->getElementType();
      }
      if (t->kind() == c10::TypeKind::ListType)
        elem_type = t->castRaw<c10::ListType>()->getElementType();
    }
    bool all_literal = true;
    for (py::handle item : items) all_literal &= !is_fx_node(item);
    if (kind == ValueKind::kOther) {
      // Unknown expected type (e.g. an output tuple): infer from the elements.
      kind = ValueKind::kIntList;
      for (py::handle item : items) {
        if (is_fx_node(item) && lookup(item)->kind() == ValueKind::kTensor)
          kind = ValueKind::kTensorList;
        if (py::isinstance<py::float_>(item)) kind = ValueKind::kFloatList;
      }
    }
    if (all_literal && (kind == ValueKind::kIntList || kind == ValueKind::kFloatList ||
                        kind == ValueKind::kBoolList)) {
      if (kind == ValueKind::kIntList) {
        c10::List<int64_t> list;
        for (py::handle item : items) list.push_back(item.cast<int64_t>());
        return constant(list, kind);
      }
      if (kind == ValueKind::kFloatList) {
        c10::List<double> list;
        for (py::handle item : items) list.push_back(item.cast<double>());
        return constant(list, kind);
      }
      c10::List<bool> list;
      for (py::handle item : items) list.push_back(item.cast<bool>());
      return constant(list, kind);
    }
    std::vector<ir::Value*> values;
    for (py::handle item : items) values.push_back(convert(item, elem_type));
    return graph_->add_list(kind, std::move(values))->output();
  }

  // --- types --------------------------------------------------------------------------------
  // A size: an int, a SymInt, or (in a graph from the compiled-module cache) a sympy
  // expression.
  ir::SymExpr sym_of(py::handle x) {
    if (py::isinstance(x, sym_int_type_)) return from_sympy(x.attr("node").attr("expr"));
    if (py::isinstance<py::int_>(x)) return ir::SymExpr(x.cast<int64_t>());
    return from_sympy(x);
  }

  // The kind of record (_cached_graph.TensorRecord / SymRecord) `val` is, or "" for none:
  // a graph from the compiled-module cache describes its values with those.
  static std::string record_kind(py::handle val) {
    if (THPVariable_Check(val.ptr()) || !py::hasattr(val, "magi_record")) return "";
    return py::str(val.attr("magi_record")).cast<std::string>();
  }

  // A fake tensor, or its record.
  static bool is_tensor_value(py::handle val) {
    return THPVariable_Check(val.ptr()) || record_kind(val) == "tensor";
  }

  std::optional<ir::TensorType> tensor_type_of(py::handle val) {
    if (!is_tensor_value(val)) return std::nullopt;
    ir::TensorType t;
    t.dtype = reinterpret_cast<THPDtype*>(val.attr("dtype").ptr())->scalar_type;
    t.device = reinterpret_cast<THPDevice*>(val.attr("device").ptr())->device;
    t.requires_grad = val.attr("requires_grad").cast<bool>();
    for (py::handle s : val.attr("shape")) t.sizes.push_back(sym_of(s));
    try {
      for (py::handle s : val.attr("stride")()) t.strides.push_back(sym_of(s));
    } catch (const py::error_already_set&) {
      t.strides.clear();  // layouts without strides (sparse, nested)
    }
    return t;
  }

  // Sets kind, tensor type and symbolic value of `v` from an FX meta["val"].
  void annotate(ir::Value* v, py::handle val) {
    if (val.is_none()) return;
    if (auto t = tensor_type_of(val)) {
      v->set_kind(ir::ValueKind::kTensor);
      v->set_tensor_type(std::move(*t));
    } else if (record_kind(val) == "sym") {
      const std::string kind = py::str(val.attr("kind")).cast<std::string>();
      v->set_kind(kind == "int"     ? ir::ValueKind::kInt
                  : kind == "float" ? ir::ValueKind::kFloat
                                    : ir::ValueKind::kBool);
      if (kind == "int") v->set_sym(sym_of(val.attr("expr")));
    } else if (py::isinstance(val, sym_int_type_) || py::isinstance<py::int_>(val)) {
      if (py::isinstance<py::bool_>(val)) {
        v->set_kind(ir::ValueKind::kBool);
        return;
      }
      v->set_kind(ir::ValueKind::kInt);
      v->set_sym(sym_of(val));
    } else if (py::isinstance(val, sym_float_type_) || py::isinstance<py::float_>(val)) {
      v->set_kind(ir::ValueKind::kFloat);
    } else if (py::isinstance(val, sym_bool_type_) || py::isinstance<py::bool_>(val)) {
      v->set_kind(ir::ValueKind::kBool);
    }
  }

  py::object meta_val(py::handle node) {
    py::dict meta = node.attr("meta");
    return meta.contains("val") ? py::reinterpret_borrow<py::object>(meta["val"]) : py::none();
  }

  void set_provenance(ir::Node* n, py::handle fx) {
    auto& p = n->provenance();
    p.fx_name = py_str(fx.attr("name"));
    py::dict meta = fx.attr("meta");
    if (!meta.contains("stack_trace") || meta["stack_trace"].is_none()) return;
    std::string trace = py_str(meta["stack_trace"]);
    auto at = trace.rfind("File \"");
    if (at == std::string::npos) return;
    auto file_end = trace.find('"', at + 6);
    auto line_at = trace.find("line ", file_end);
    auto in_at = trace.find(", in ", line_at);
    auto eol = trace.find('\n', in_at == std::string::npos ? line_at : in_at);
    if (file_end == std::string::npos || line_at == std::string::npos) return;
    std::string file = trace.substr(at + 6, file_end - at - 6);
    file =
        file.substr(file.find_last_of('/') == std::string::npos ? 0 : file.find_last_of('/') + 1);
    std::string line =
        trace.substr(line_at + 5, trace.find_first_not_of("0123456789", line_at + 5) - line_at - 5);
    p.source = file + ":" + line;
    if (in_at != std::string::npos) p.source += " in " + trace.substr(in_at + 5, eol - in_at - 5);
    if (eol != std::string::npos) {
      std::string code = trace.substr(eol + 1);
      code = code.substr(0, code.find('\n'));
      auto first = code.find_first_not_of(' ');
      p.source_code = first == std::string::npos ? "" : code.substr(first);
    }
  }

  void bind(py::handle fx, std::vector<ir::Value*> outputs) {
    std::string name = py_str(fx.attr("name"));
    for (size_t i = 0; i < outputs.size(); ++i) {
      outputs[i]->set_name(
          graph_->unique_name(outputs.size() == 1 ? name : name + "_" + std::to_string(i)));
    }
    env_[fx.ptr()] = std::move(outputs);
  }

  // --- nodes --------------------------------------------------------------------------------
  void import_placeholder(py::handle node) {
    std::string name = py_str(node.attr("name"));
    ir::Value* v = graph_->add_input(name, ir::ValueKind::kOther);
    annotate(v, meta_val(node));
    set_provenance(v->producer(), node);
    env_[node.ptr()] = {v};
  }

  void import_get_attr(py::handle node) {
    py::object value = py::reinterpret_borrow<py::object>(gm_);
    std::string target = node.attr("target").cast<std::string>();
    size_t start = 0;
    while (start <= target.size()) {
      size_t dot = target.find('.', start);
      value = value.attr(target.substr(start, dot - start).c_str());
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
    MAGI_CHECK(THPVariable_Check(value.ptr()), "get_attr '", target,
               "' is not a tensor; only tensor constants can be imported");
    ir::Value* v = constant(THPVariable_Unpack(value.ptr()), ir::ValueKind::kTensor);
    annotate(v, meta_val(node));
    set_provenance(v->producer(), node);
    bind(node, {v});
  }

  void import_output(py::handle node) {
    py::tuple args = node.attr("args");
    std::vector<ir::Value*> outs;
    py::handle result = args[0];
    if (py::isinstance<py::list>(result) || py::isinstance<py::tuple>(result)) {
      for (py::handle item : result) outs.push_back(convert(item, nullptr));
    } else {
      outs.push_back(convert(result, nullptr));
    }
    set_provenance(graph_->set_outputs(std::move(outs)), node);
  }

  void import_call(py::handle node) {
    py::handle target = node.attr("target");
    py::tuple args = node.attr("args");
    py::dict kwargs = node.attr("kwargs");

    if (target.is(getitem_)) return import_getitem(node, args);
    if (target.is(sym_sum_)) return import_sym_sum(node, args);
    auto sym = python_sym_ops_.find(target.ptr());
    if (sym != python_sym_ops_.end()) {
      std::vector<ir::Value*> inputs;
      for (py::handle a : args) inputs.push_back(convert(a, nullptr));
      return finish_sym(node, sym->second.second, std::move(inputs));
    }
    if (py::isinstance(target, hop_type_)) {
      std::string hop = py_str(target.attr("__name__"));
      if (hop == "auto_functionalized" || hop == "auto_functionalized_v2") {
        return import_auto_functionalized(node, hop == "auto_functionalized_v2");
      }
      MAGI_UNSUPPORTED("higher-order operator ", py_str(target.attr("__name__")), " in FX node '",
                       py_str(node.attr("name")), "' is not supported yet");
    }
    if (!py::isinstance(target, op_overload_type_)) {
      MAGI_UNSUPPORTED("FX node '", py_str(node.attr("name")), "' calls ",
                       py::repr(target).cast<std::string>(),
                       ", which is neither an ATen/custom operator overload nor integer "
                       "arithmetic on sizes");
    }

    py::handle schema_py = target.attr("_schema");
    std::string name = schema_py.attr("name").cast<std::string>();
    std::string overload = schema_py.attr("overload_name").cast<std::string>();
    if (name == "aten::sym_size" || name == "aten::sym_stride" || name == "aten::sym_numel") {
      ir::SymOp op = name == "aten::sym_size"     ? ir::SymOp::kSize
                     : name == "aten::sym_stride" ? ir::SymOp::kStride
                                                  : ir::SymOp::kNumel;
      std::vector<ir::Value*> inputs;
      for (py::handle a : args) inputs.push_back(convert(a, nullptr));
      return finish_sym(node, op, std::move(inputs));
    }

    auto handle = c10::Dispatcher::singleton().findSchema({name, overload});
    MAGI_CHECK(handle.has_value(), "operator ", name, ".", overload, " (FX node '",
               py_str(node.attr("name")), "') is not registered with the dispatcher");
    const c10::FunctionSchema& schema = handle->schema();

    std::vector<ir::Value*> inputs;
    size_t positional = 0;
    for (const c10::Argument& arg : schema.arguments()) {
      if (!arg.kwarg_only() && positional < args.size()) {
        inputs.push_back(convert(args[positional++], arg.real_type()));
      } else if (kwargs.contains(arg.name())) {
        inputs.push_back(convert(kwargs[py::str(arg.name())], arg.real_type()));
      } else if (arg.default_value().has_value()) {
        const c10::IValue& d = *arg.default_value();
        inputs.push_back(
            constant(d, d.isNone() ? ir::ValueKind::kNone : ir::value_kind_of(arg.real_type())));
      } else {
        MAGI_CHECK(false, "FX node '", py_str(node.attr("name")), "' calls ", name, ".", overload,
                   " without its required argument '", arg.name(), "'");
      }
    }
    MAGI_CHECK(positional == args.size(), "FX node '", py_str(node.attr("name")), "' passes ",
               args.size(), " positional arguments to ", name, ".", overload, ", which takes ",
               positional);

    ir::Node* n = graph_->add_op(*handle, std::move(inputs));
    set_provenance(n, node);
    py::object val = meta_val(node);
    if (n->outputs().size() == 1) {
      annotate(n->output(), val);
    } else if (!val.is_none() &&
               (py::isinstance<py::tuple>(val) || py::isinstance<py::list>(val))) {
      py::sequence vals = val;
      for (size_t i = 0; i < n->outputs().size() && i < vals.size(); ++i)
        annotate(n->output(i), vals[i]);
    }
    // A Tensor[] return stays a list value whatever meta says.
    for (size_t i = 0; i < n->outputs().size(); ++i) {
      ir::ValueKind k = ir::value_kind_of(schema.returns()[i].type());
      if (ir::is_list_kind(k)) n->output(i)->set_kind(k);
    }
    bind(node, n->outputs());
  }

  // torch.sym_sum([a, b, ...]), which Dynamo writes for a sum of several sizes: a chain of adds.
  void import_sym_sum(py::handle node, py::tuple args) {
    MAGI_CHECK(args.size() == 1 && py::isinstance<py::sequence>(args[0]), "FX node '",
               py_str(node.attr("name")), "': sym_sum takes one list of integers");
    std::vector<ir::Value*> terms;
    for (py::handle a : args[0]) terms.push_back(convert(a, nullptr));
    MAGI_CHECK(!terms.empty(), "FX node '", py_str(node.attr("name")), "': sym_sum of nothing");
    if (terms.size() == 1) return bind(node, {terms[0]});
    ir::Value* sum = terms[0];
    for (size_t i = 1; i + 1 < terms.size(); ++i) {
      ir::Node* n = graph_->add_sym(ir::SymOp::kAdd, {sum, terms[i]});
      set_provenance(n, node);
      sum = n->output();
    }
    finish_sym(node, ir::SymOp::kAdd, {sum, terms.back()});
  }

  void finish_sym(py::handle node, ir::SymOp op, std::vector<ir::Value*> inputs) {
    MAGI_CHECK(static_cast<int>(inputs.size()) == ir::sym_op_arity(op), "FX node '",
               py_str(node.attr("name")), "': ", ir::sym_op_name(op), " takes ",
               ir::sym_op_arity(op), " arguments, got ", inputs.size());
    ir::Node* n = graph_->add_sym(op, std::move(inputs));
    set_provenance(n, node);
    ir::ValueKind kind = n->output()->kind();
    annotate(n->output(), meta_val(node));
    if (n->output()->kind() == ir::ValueKind::kOther) n->output()->set_kind(kind);
    bind(node, {n->output()});
  }

  // auto_functionalized(op, **kwargs) and auto_functionalized_v2(op, **kwargs) are AOTAutograd's
  // functional form of a call of an operator that mutates arguments (a custom op with
  // mutates_args). They become a call of the op itself on fresh copies of what it mutates; the
  // node's results are (the op's results..., the copies...), as in the reference
  // implementation (torch/_higher_order_ops/auto_functionalize.py). v1 names the mutated
  // tensors; v2 names their bases and how to view each base again.
  void import_auto_functionalized(py::handle node, bool v2) {
    py::tuple args = node.attr("args");
    py::dict kwargs = node.attr("kwargs");
    py::handle schema_py = args[0].attr("_schema");
    std::string name = schema_py.attr("name").cast<std::string>();
    std::string overload = schema_py.attr("overload_name").cast<std::string>();
    auto handle = c10::Dispatcher::singleton().findSchema({name, overload});
    MAGI_CHECK(handle.has_value(), "operator ", name, " (FX node '", py_str(node.attr("name")),
               "') is not registered with the dispatcher");
    const c10::FunctionSchema& schema = handle->schema();

    std::vector<ir::Value*> copies;  // the node's results after the op's own
    std::vector<ir::Value*> fresh;   // values created here, to annotate and name
    std::unordered_map<std::string, ir::Value*> mutated;
    auto clone = [&](ir::Value* v) {
      ir::Value* c = add_call("aten::clone", "", {v});
      fresh.push_back(c);
      return c;
    };
    if (v2) {
      std::vector<ir::Value*> bases;
      py::object only = kwargs.contains("_only_clone_these_bases")
                            ? py::reinterpret_borrow<py::object>(kwargs["_only_clone_these_bases"])
                            : py::none();
      std::vector<int64_t> clone_these;
      if (!only.is_none()) {
        for (py::handle i : only) clone_these.push_back(i.cast<int64_t>());
      }
      py::list all = kwargs["_all_bases"];
      for (size_t i = 0; i < all.size(); ++i) {
        check_base_offset(all[i]);
        ir::Value* base = lookup(all[i]);
        bool copy = only.is_none() || std::find(clone_these.begin(), clone_these.end(),
                                                int64_t(i)) != clone_these.end();
        bases.push_back(copy ? clone(base) : base);
      }
      copies = bases;
      for (const c10::Argument& arg : schema.arguments()) {
        if (!arg.alias_info() || !arg.alias_info()->isWrite()) continue;
        std::string prefix = "_" + arg.name();
        if (arg.real_type()->kind() != c10::TypeKind::ListType &&
            !(arg.real_type()->kind() == c10::TypeKind::OptionalType &&
              arg.real_type()->castRaw<c10::OptionalType>()->getElementType()->kind() ==
                  c10::TypeKind::ListType)) {
          mutated[arg.name()] = regenerate_view(prefix, kwargs, bases);
          continue;
        }
        py::object length = kwargs[py::str(prefix + "_length")];
        if (length.is_none()) {
          mutated[arg.name()] = constant(c10::IValue(), ir::ValueKind::kNone);
          continue;
        }
        std::vector<ir::Value*> items;
        bool optional_items = false;
        for (int64_t i = 0; i < length.cast<int64_t>(); ++i) {
          items.push_back(regenerate_view(prefix + "_" + std::to_string(i), kwargs, bases));
          optional_items |= items.back()->kind() == ir::ValueKind::kNone;
        }
        mutated[arg.name()] = graph_
                                  ->add_list(optional_items ? ir::ValueKind::kOptionalTensorList
                                                            : ir::ValueKind::kTensorList,
                                             std::move(items))
                                  ->output();
      }
    } else {
      py::object only =
          kwargs.contains("_only_clone_these_tensors")
              ? py::reinterpret_borrow<py::object>(kwargs["_only_clone_these_tensors"])
              : py::none();
      for (const c10::Argument& arg : schema.arguments()) {
        if (!arg.alias_info() || !arg.alias_info()->isWrite()) continue;
        py::handle given = kwargs[py::str(arg.name())];
        bool copy = only.is_none() || only.contains(py::str(arg.name()));
        ir::Value* v;
        if (given.is_none()) {
          v = constant(c10::IValue(), ir::ValueKind::kNone);
        } else if (py::isinstance<py::list>(given) || py::isinstance<py::tuple>(given)) {
          std::vector<ir::Value*> items;
          for (py::handle item : given) items.push_back(copy ? clone(lookup(item)) : lookup(item));
          v = graph_->add_list(ir::ValueKind::kTensorList, std::move(items))->output();
        } else {
          v = copy ? clone(lookup(given)) : lookup(given);
        }
        mutated[arg.name()] = v;
        copies.push_back(v);
      }
    }

    std::vector<ir::Value*> inputs;
    for (const c10::Argument& arg : schema.arguments()) {
      if (auto it = mutated.find(arg.name()); it != mutated.end()) {
        inputs.push_back(it->second);
      } else if (kwargs.contains(arg.name())) {
        inputs.push_back(convert(kwargs[py::str(arg.name())], arg.real_type()));
      } else if (arg.default_value().has_value()) {
        const c10::IValue& d = *arg.default_value();
        inputs.push_back(
            constant(d, d.isNone() ? ir::ValueKind::kNone : ir::value_kind_of(arg.real_type())));
      } else {
        MAGI_CHECK(false, "FX node '", py_str(node.attr("name")), "' calls ", name,
                   " without its required argument '", arg.name(), "'");
      }
    }
    ir::Node* call = graph_->add_op(*handle, std::move(inputs));
    set_provenance(call, node);
    std::vector<ir::Value*> results = call->outputs();
    if (results.empty()) results.push_back(constant(c10::IValue(), ir::ValueKind::kNone));
    fresh.insert(fresh.end(), call->outputs().begin(), call->outputs().end());
    results.insert(results.end(), copies.begin(), copies.end());

    py::object val = meta_val(node);
    if (!val.is_none() && (py::isinstance<py::tuple>(val) || py::isinstance<py::list>(val))) {
      py::sequence vals = val;
      for (size_t i = 0; i < results.size() && i < vals.size(); ++i) {
        if (std::find(fresh.begin(), fresh.end(), results[i]) != fresh.end()) {
          annotate(results[i], vals[i]);
        }
      }
    }
    std::string base_name = py_str(node.attr("name"));
    for (size_t i = 0; i < results.size(); ++i) {
      if (std::find(fresh.begin(), fresh.end(), results[i]) != fresh.end()) {
        results[i]->set_name(graph_->unique_name(base_name + "_" + std::to_string(i)));
      }
    }
    env_[node.ptr()] = std::move(results);
  }

  // A mutated argument of auto_functionalized_v2, viewed again from its (copied) base.
  ir::Value* regenerate_view(const std::string& prefix, py::dict kwargs,
                             const std::vector<ir::Value*>& bases) {
    auto get = [&](const std::string& key) { return kwargs[py::str(key)]; };
    py::object index = get(prefix + "_base_index");
    if (index.is_none()) return constant(c10::IValue(), ir::ValueKind::kNone);
    ir::Value* base = bases.at(index.cast<size_t>());
    if (kwargs.contains(prefix + "_alias")) return add_call("aten::alias", "", {base});
    if (kwargs.contains(prefix + "_storage_offset")) {
      return add_call(
          "aten::as_strided", "", {base},
          {get(prefix + "_size"), get(prefix + "_stride"), get(prefix + "_storage_offset")});
    }
    if (kwargs.contains(prefix + "_slice_dim")) {
      return add_call(
          "aten::slice", "Tensor", {base},
          {get(prefix + "_slice_dim"), get(prefix + "_slice_start"), get(prefix + "_slice_end")});
    }
    return base;
  }

  // Copies of a base start at offset 0, so views of it recreated with as_strided are only right
  // when the base itself starts at offset 0 (as fresh tensors and ordinary inputs do).
  void check_base_offset(py::handle fx_base) {
    py::object val = meta_val(fx_base);
    if (!is_tensor_value(val)) return;
    py::object offset = val.attr("storage_offset")();
    if (py::isinstance<py::int_>(offset) && offset.cast<int64_t>() == 0) return;
    MAGI_UNSUPPORTED("FX node '", py_str(current_.attr("name")),
                     "' calls a mutating operator on a view of a tensor whose storage starts at "
                     "offset ",
                     py_str(offset),
                     "; pass the operator a tensor that owns its storage (e.g. .clone() it first)");
  }

  // A call of `name.overload` on `values`, then `rest` (Python values converted to the schema's
  // types), then the schema's defaults.
  ir::Value* add_call(const char* name, const char* overload, std::vector<ir::Value*> values,
                      std::vector<py::object> rest = {}) {
    auto op = c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
    const auto& arguments = op.schema().arguments();
    for (py::object& r : rest)
      values.push_back(convert(r, arguments.at(values.size()).real_type()));
    for (size_t i = values.size(); i < arguments.size(); ++i) {
      const c10::IValue& d = *arguments[i].default_value();
      values.push_back(constant(
          d, d.isNone() ? ir::ValueKind::kNone : ir::value_kind_of(arguments[i].real_type())));
    }
    ir::Node* n = graph_->add_op(op, std::move(values));
    set_provenance(n, current_);
    n->output()->set_kind(ir::ValueKind::kTensor);
    return n->output();
  }

  void import_getitem(py::handle node, py::tuple args) {
    py::handle source = args[0];
    int64_t index = args[1].cast<int64_t>();
    MAGI_CHECK(is_fx_node(source), "getitem on a literal in FX node '", py_str(node.attr("name")),
               "'");
    const auto& outs = env_.at(source.ptr());
    if (outs.size() > 1) {
      // Multi-return operator: the getitem names one of its outputs.
      MAGI_CHECK(index >= 0 && size_t(index) < outs.size(), "getitem index ", index,
                 " out of range for a node with ", outs.size(), " outputs");
      ir::Value* v = outs[index];
      v->set_name(graph_->unique_name(py_str(node.attr("name"))));
      env_[node.ptr()] = {v};
      return;
    }
    ir::Node* n = graph_->add_getitem(outs.front(), index);
    set_provenance(n, node);
    annotate(n->output(), meta_val(node));
    bind(node, {n->output()});
  }

  py::module_ torch_;
  py::object fx_node_type_, op_overload_type_, hop_type_, sym_int_type_, sym_float_type_,
      sym_bool_type_, getitem_, sym_sum_;
  std::unordered_map<PyObject*, std::pair<py::object, ir::SymOp>> python_sym_ops_;
  std::unique_ptr<ir::Graph> graph_;
  py::handle gm_;
  py::handle current_;
  std::unordered_map<PyObject*, std::vector<ir::Value*>> env_;
};

}  // namespace

std::unique_ptr<ir::Graph> import_fx_graph(py::handle graph_module) {
  FxImporter importer;
  auto graph = importer.run(graph_module);
  MAGI_LOG_DEBUG("imported FX graph: ", graph->num_nodes(), " nodes");
  return graph;
}

}  // namespace magi::bindings
