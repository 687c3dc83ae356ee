// See plan_check_ffi.h. The output's layout is PlanCheckWord (fo_jax/_cuda_ops.py reads it).
#include "ffi/plan_check_ffi.h"

#include <cstdint>

#include "comm/overlap_plan.h"
#include "comm/status.h"
#include "ffi/ffi_status.h"
#include "ffi/plan_attrs.h"
#include "kernels/signaling_gemm.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace fo_jax {
namespace {

// Output words: the GEMM's arguments for the given rank, then each group's expected count.
enum PlanCheckWord {
  kPlanCheckBatch = 0,
  kPlanCheckM,  // rows per batch
  kPlanCheckN,
  kPlanCheckK,
  kPlanCheckConfig,
  kPlanCheckNumGroups,
  kPlanCheckSmBudget,  // as planned (the call resolves a negative one on its device)
  kPlanCheckRotateTileRows,
  kPlanCheckRotatePeriod,
  kPlanCheckOutputRows,
  kPlanCheckRank,   // this device's, from the mesh table
  kPlanCheckGroup,
  kPlanCheckExpected0,  // kMaxGemmGroups words
  kPlanCheckWords = kPlanCheckExpected0 + kMaxGemmGroups,
};

Status Check(ffi::Result<ffi::Buffer<ffi::S32>> out, const OverlapPlanAttr& plan_attr,
             const MeshAttr& mesh, GemmDtype dtype, int32_t m, int32_t n, int32_t k,
             int32_t device) {
  if (out->element_count() != kPlanCheckWords) {
    return Status::InvalidArgument("the output takes " + std::to_string(kPlanCheckWords) +
                                   " words");
  }
  OverlapPlan plan;
  FO_JAX_RETURN_IF_ERROR(DecodeOverlapPlan(plan_attr, &plan));
  const OverlapShape shape{dtype, m, n, k};
  FO_JAX_RETURN_IF_ERROR(ValidateOverlapPlan(plan, shape));
  MeshPlace place;
  FO_JAX_RETURN_IF_ERROR(FindInMesh(mesh, device, &place));
  if (place.rank < 0 || place.rank >= plan.axis_size) {
    return Status::InvalidArgument("rank out of range");
  }
  const SignalingGemmArgs args = OverlapGemmArgs(plan, shape, place.rank);
  int32_t* words = out->typed_data();
  for (int i = 0; i < kPlanCheckWords; ++i) words[i] = 0;
  words[kPlanCheckBatch] = args.batch;
  words[kPlanCheckM] = args.m;
  words[kPlanCheckN] = args.n;
  words[kPlanCheckK] = args.k;
  words[kPlanCheckConfig] = args.config;
  words[kPlanCheckNumGroups] = args.num_groups;
  words[kPlanCheckSmBudget] = args.sm_budget;
  words[kPlanCheckRotateTileRows] = args.rotate_tile_rows;
  words[kPlanCheckRotatePeriod] = args.rotate_period_tile_rows;
  words[kPlanCheckOutputRows] = static_cast<int32_t>(OutputRows(plan, shape));
  words[kPlanCheckRank] = place.rank;
  words[kPlanCheckGroup] = place.group;
  for (int g = 0; g < args.num_groups; ++g) {
    words[kPlanCheckExpected0 + g] = ExpectedGroupCount(args, g);
  }
  return Status::Ok();
}

ffi::Error CheckImpl(ffi::Result<ffi::Buffer<ffi::S32>> out, OverlapPlanAttr plan,
                     MeshAttr mesh, GemmDtype dtype, int32_t m, int32_t n, int32_t k,
                     int32_t device) {
  return ToFfiError(Check(out, plan, mesh, dtype, m, n, k, device), "fo_jax_check_overlap_plan");
}

}  // namespace
}  // namespace fo_jax

XLA_FFI_REGISTER_ENUM_ATTR_DECODING(fo_jax::GemmDtype);

XLA_FFI_DEFINE_HANDLER_SYMBOL(FoJaxCheckOverlapPlanFfi, fo_jax::CheckImpl,
                              ffi::Ffi::Bind()
                                  .Ret<ffi::Buffer<ffi::S32>>()            // PlanCheckWord
                                  .Attr<fo_jax::OverlapPlanAttr>("plan")   // _plan.OverlapPlan
                                  .Attr<fo_jax::MeshAttr>("mesh")          // the mesh table
                                  .Attr<fo_jax::GemmDtype>("dtype")        // the operands'
                                  .Attr<int32_t>("m")                      // x [m, k]
                                  .Attr<int32_t>("n")                      // w [k, n]
                                  .Attr<int32_t>("k")
                                  .Attr<int32_t>("device"));               // local ordinal
