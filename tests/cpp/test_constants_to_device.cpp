// constants_to_device on hand-built graphs: `mask[pos] = True` on a tensor outside host memory
// reads a constant on the tensor's device instead of copying the host constant each call. The
// graphs' device tensors are on the meta device, which needs no GPU.
#include <gtest/gtest.h>

#include "magi/ir/verifier.h"
#include "magi/passes/passes.h"
#include "magi/passes/pipeline.h"

#include "fusion_builder.h"
#include "test_helpers.h"

namespace magi::passes {
namespace {

using ir::Graph;
using ir::Node;
using ir::Value;
using ir::ValueKind;

const c10::Device kMeta(c10::DeviceType::Meta);

// mask: bool [8, 1] on `device`; mask[pos] = True as the capture records it:
// index_put(mask, [pos], lift_fresh_copy(constant True)). Each option changes one thing.
struct MaskUpdate {
  Graph g;
  Node* update = nullptr;
  Node* second = nullptr;
  Node* add = nullptr;

  struct Options {
    c10::Device device = kMeta;
    bool also_added = false;  // the constant is also added to a host tensor (read in host memory)
    bool direct = false;      // the update reads the constant itself, not a lift_fresh_copy
    bool untyped = false;     // the constant has no tensor type
    bool second_update = false;  // a second mask[pos] = True, with its own (equal) constant
  };

  explicit MaskUpdate(const Options& o) {
    test::Builder b(g);
    ir::TensorType mask_type = test::tensor_type({8, 1}, c10::ScalarType::Bool);
    mask_type.device = o.device;
    ir::TensorType pos_type = test::tensor_type({1}, c10::ScalarType::Long);
    pos_type.device = o.device;
    Value* mask = g.add_tensor_input("mask", mask_type);
    Value* pos = g.add_tensor_input("pos", pos_type);
    Value* host = b.input("host", {4}, c10::ScalarType::Bool);
    auto set_true = [&](Value* target, const char* name) {
      Value* constant = g.add_constant(at::scalar_tensor(true, at::kBool), ValueKind::kTensor);
      if (!o.untyped) constant->set_tensor_type(test::tensor_type({}, c10::ScalarType::Bool));
      Value* values = o.direct ? constant
                               : b.op("aten::lift_fresh_copy", "", {constant},
                                      test::tensor_type({}, c10::ScalarType::Bool), "fresh");
      Value* indices = g.add_list(ValueKind::kOptionalTensorList, {pos})->output();
      return b.op("aten::index_put", "", {target, indices, values, b.flag(false)}, mask_type, name);
    };
    Value* updated = set_true(mask, "updated");
    update = updated->producer();
    std::vector<Value*> outputs = {updated};
    if (o.second_update) {
      outputs.push_back(set_true(updated, "again"));
      second = outputs.back()->producer();
    }
    if (o.also_added) {
      Value* constant = update->input(2)->producer()->kind() == ir::NodeKind::kConstant
                            ? update->input(2)
                            : update->input(2)->producer()->input(0);
      outputs.push_back(b.binary("aten::add", host, constant, *host->tensor_type(), "sum"));
      add = outputs.back()->producer();
    }
    g.set_outputs(outputs);
    ir::verify(g);
  }
};

// The tensor constants of `g`, in order.
std::vector<at::Tensor> tensor_constants(const Graph& g) {
  std::vector<at::Tensor> out;
  for (const Node* n : g.nodes()) {
    if (n->kind() == ir::NodeKind::kConstant && n->constant().isTensor()) {
      out.push_back(n->constant().toTensor());
    }
  }
  return out;
}

TEST(ConstantsToDevice, AnUpdateOfADeviceTensorReadsADeviceConstant) {
  MaskUpdate m({});
  EXPECT_TRUE(constants_to_device(m.g));
  ir::verify(m.g);
  const Node* values = m.update->input(2)->producer();
  ASSERT_EQ(values->kind(), ir::NodeKind::kConstant);
  const at::Tensor t = values->constant().toTensor();
  EXPECT_EQ(t.device(), kMeta);
  EXPECT_EQ(t.dim(), 0);
  EXPECT_EQ(t.scalar_type(), at::kBool);
  EXPECT_EQ(m.update->input(2)->tensor_type()->device, kMeta);
  // The lift_fresh_copy and the host constant are gone.
  EXPECT_EQ(test::count_ops(m.g, "aten::lift_fresh_copy"), 0);
  for (const at::Tensor& t : tensor_constants(m.g)) EXPECT_FALSE(t.device().is_cpu());
  EXPECT_FALSE(constants_to_device(m.g)) << "a second run finds nothing to move";
}

TEST(ConstantsToDevice, AnUpdateOfAHostTensorKeepsTheHostConstant) {
  MaskUpdate m({.device = c10::Device(c10::DeviceType::CPU)});
  EXPECT_FALSE(constants_to_device(m.g));
  EXPECT_EQ(m.update->input(2)->producer()->op_name(), "aten::lift_fresh_copy");
}

TEST(ConstantsToDevice, OtherReadersOfTheConstantKeepTheHostTensor) {
  MaskUpdate m({.also_added = true});
  EXPECT_TRUE(constants_to_device(m.g));
  ir::verify(m.g);
  EXPECT_EQ(m.update->input(2)->producer()->constant().toTensor().device(), kMeta);
  const Node* added = m.add->input(1)->producer();
  ASSERT_EQ(added->kind(), ir::NodeKind::kConstant);
  EXPECT_TRUE(added->constant().toTensor().device().is_cpu());
}

TEST(ConstantsToDevice, AConstantReadDirectlyIsMovedToo) {
  MaskUpdate m({.direct = true});
  EXPECT_TRUE(constants_to_device(m.g));
  ir::verify(m.g);
  const std::vector<at::Tensor> constants = tensor_constants(m.g);
  ASSERT_EQ(constants.size(), 1u);
  EXPECT_EQ(constants[0].device(), kMeta);
}

// Each layer's `mask[pos] = True` has its own constant; equal values share one device copy, so
// that identical layers still make identical pieces.
TEST(ConstantsToDevice, EqualConstantsShareOneDeviceCopy) {
  MaskUpdate m({.second_update = true});
  ASSERT_EQ(tensor_constants(m.g).size(), 2u);
  EXPECT_TRUE(constants_to_device(m.g));
  ir::verify(m.g);
  EXPECT_EQ(m.update->input(2), m.second->input(2));
  const std::vector<at::Tensor> constants = tensor_constants(m.g);
  ASSERT_EQ(constants.size(), 1u);
  EXPECT_EQ(constants[0].device(), kMeta);
}

TEST(ConstantsToDevice, TheDeviceCopyIsTypedFromItsTensor) {
  MaskUpdate m({.untyped = true});
  EXPECT_TRUE(constants_to_device(m.g));
  const auto& type = m.update->input(2)->tensor_type();
  ASSERT_TRUE(type.has_value());
  EXPECT_EQ(type->str(), "b8[]@meta");
}

TEST(ConstantsToDevice, RunsInThePipelineAndCanBeDisabled) {
  for (bool disabled : {false, true}) {
    MaskUpdate m({});
    PipelineOptions options;
    if (disabled) options.disabled = {"constants_to_device"};
    run_pipeline(m.g, options);
    EXPECT_EQ(test::count_ops(m.g, "aten::lift_fresh_copy"), disabled ? 1 : 0);
  }
}

}  // namespace
}  // namespace magi::passes
