// See plan_attrs.h.
#include "ffi/plan_attrs.h"

#include <string>

namespace fo_jax {

Status DecodeGemmPlan(const GemmPlanAttr& attr, GemmPlan* plan) {
  const size_t entries = attr.group_begin.size();
  if (entries < 2 || entries > static_cast<size_t>(kMaxGemmGroups) + 1) {
    return Status::InvalidArgument("group table must have 2.." +
                                   std::to_string(kMaxGemmGroups + 1) + " entries, got " +
                                   std::to_string(entries));
  }
  plan->config = attr.config;
  plan->batch = attr.batch;
  plan->num_groups = static_cast<int>(entries - 1);
  for (size_t i = 0; i < entries; ++i) plan->group_begin[i] = attr.group_begin[i];
  plan->sm_budget = attr.sm_budget;
  return Status::Ok();
}

Status DecodeOverlapPlan(const OverlapPlanAttr& attr, OverlapPlan* plan) {
  plan->collective = attr.collective;
  plan->transport = attr.transport;
  plan->axis_size = attr.axis_size;
  plan->nccl_max_ctas = attr.nccl_max_ctas;
  plan->rounds = attr.rounds;
  plan->ring = attr.ring;
  plan->sum_split = attr.sum_split;
  plan->tiles_chunk = attr.tiles_chunk;
  return DecodeGemmPlan(attr.gemm, &plan->gemm);
}

Status FindInMesh(const MeshAttr& mesh, int32_t device, MeshPlace* place) {
  const size_t rows = mesh.device_process.size();
  if (mesh.device_ordinal.size() != rows || mesh.device_rank.size() != rows ||
      mesh.device_group.size() != rows) {
    return Status::InvalidArgument("mesh table columns differ in length");
  }
  for (size_t i = 0; i < rows; ++i) {
    if (mesh.device_process[i] == mesh.process && mesh.device_ordinal[i] == device) {
      *place = MeshPlace{mesh.device_rank[i], mesh.device_group[i]};
      return Status::Ok();
    }
  }
  return Status::InvalidArgument("this device (process " + std::to_string(mesh.process) +
                                 ", ordinal " + std::to_string(device) +
                                 ") is not in the mesh the call was lowered for");
}

Status GemmDtypeOf(xla::ffi::DataType type, GemmDtype* dtype) {
  switch (type) {
    case xla::ffi::DataType::BF16: *dtype = GemmDtype::kBF16; return Status::Ok();
    case xla::ffi::DataType::F16: *dtype = GemmDtype::kF16; return Status::Ok();
    case xla::ffi::DataType::F8E4M3FN: *dtype = GemmDtype::kE4M3; return Status::Ok();
    default: return Status::InvalidArgument("operands must be bf16, f16 or float8_e4m3fn");
  }
}

}  // namespace fo_jax
