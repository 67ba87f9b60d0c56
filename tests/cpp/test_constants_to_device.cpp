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
// index_put(mask, [pos], lift_fresh_copy(constant True)). `also_added`: the constant is also
// added to a host tensor, which keeps reading it from host memory.
struct MaskUpdate {
  Graph g;
  Node* update = nullptr;
  Node* add = nullptr;

  MaskUpdate(c10::Device device, bool also_added) {
    test::Builder b(g);
    ir::TensorType mask_type = test::tensor_type({8, 1}, c10::ScalarType::Bool);
    mask_type.device = device;
    ir::TensorType pos_type = test::tensor_type({1}, c10::ScalarType::Long);
    pos_type.device = device;
    Value* mask = g.add_tensor_input("mask", mask_type);
    Value* pos = g.add_tensor_input("pos", pos_type);
    Value* host = b.input("host", {4}, c10::ScalarType::Bool);
    Value* constant = g.add_constant(at::scalar_tensor(true, at::kBool), ValueKind::kTensor);
    constant->set_tensor_type(test::tensor_type({}, c10::ScalarType::Bool));
    Value* fresh = b.op("aten::lift_fresh_copy", "", {constant},
                        test::tensor_type({}, c10::ScalarType::Bool), "fresh");
    Value* indices = g.add_list(ValueKind::kOptionalTensorList, {pos})->output();
    Value* updated = b.op("aten::index_put", "", {mask, indices, fresh, b.flag(false)}, mask_type,
                          "updated");
    update = updated->producer();
    std::vector<Value*> outputs = {updated};
    if (also_added) {
      outputs.push_back(b.binary("aten::add", host, constant, *host->tensor_type(), "sum"));
      add = outputs.back()->producer();
    }
    g.set_outputs(outputs);
    ir::verify(g);
  }
};

TEST(ConstantsToDevice, AnUpdateOfADeviceTensorReadsADeviceConstant) {
  MaskUpdate m(kMeta, /*also_added=*/false);
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
  for (const Node* n : m.g.nodes()) {
    if (n->kind() == ir::NodeKind::kConstant && n->constant().isTensor()) {
      EXPECT_FALSE(n->constant().toTensor().device().is_cpu());
    }
  }
  EXPECT_FALSE(constants_to_device(m.g)) << "a second run finds nothing to move";
}

TEST(ConstantsToDevice, AnUpdateOfAHostTensorKeepsTheHostConstant) {
  MaskUpdate m(c10::Device(c10::DeviceType::CPU), /*also_added=*/false);
  EXPECT_FALSE(constants_to_device(m.g));
  EXPECT_EQ(m.update->input(2)->producer()->op_name(), "aten::lift_fresh_copy");
}

TEST(ConstantsToDevice, OtherReadersOfTheConstantKeepTheHostTensor) {
  MaskUpdate m(kMeta, /*also_added=*/true);
  EXPECT_TRUE(constants_to_device(m.g));
  ir::verify(m.g);
  EXPECT_EQ(m.update->input(2)->producer()->constant().toTensor().device(), kMeta);
  const Node* added = m.add->input(1)->producer();
  ASSERT_EQ(added->kind(), ir::NodeKind::kConstant);
  EXPECT_TRUE(added->constant().toTensor().device().is_cpu());
}

TEST(ConstantsToDevice, RunsInThePipelineAndCanBeDisabled) {
  for (bool disabled : {false, true}) {
    MaskUpdate m(kMeta, /*also_added=*/false);
    PipelineOptions options;
    if (disabled) options.disabled = {"constants_to_device"};
    run_pipeline(m.g, options);
    EXPECT_EQ(test::count_ops(m.g, "aten::lift_fresh_copy"), disabled ? 1 : 0);
  }
}

}  // namespace
}  // namespace magi::passes
