// The struct attributes of fo_jax's FFI calls (fo_jax/_cuda_ops.py builds them) and their
// decoding into the JAX-free plans of comm/: `plan` (GemmPlanAttr for the GEMM alone,
// OverlapPlanAttr for an overlapped call), `mesh` (MeshAttr: which rank of which group each
// device of the lowering mesh is). XLA decodes them by member name
// (XLA_FFI_REGISTER_STRUCT_ATTR_DECODING); the enums' values are comm/overlap_plan.h's, which
// the nanobind module hands to Python.
#pragma once

#include <cstdint>

#include "comm/gemm_plan.h"
#include "comm/overlap_plan.h"
#include "comm/status.h"
#include "xla/ffi/api/ffi.h"

namespace fo_jax {

struct GemmPlanAttr {
  int32_t config;
  int32_t batch;
  xla::ffi::Span<const int32_t> group_begin;
  int32_t sm_budget;
};

struct OverlapPlanAttr {
  Collective collective;
  Transport transport;
  int32_t axis_size;
  GemmPlanAttr gemm;
  int32_t nccl_max_ctas;
  int32_t rounds;
  bool ring;
  SumSplit sum_split;
  int32_t tiles_chunk;
};

// One row per device of the lowering mesh (columns of equal length) and this process's index.
struct MeshAttr {
  int32_t process;
  xla::ffi::Span<const int32_t> device_process;  // the device's process index
  xla::ffi::Span<const int32_t> device_ordinal;  // its local hardware id
  xla::ffi::Span<const int32_t> device_rank;     // its rank along the reduced axis
  xla::ffi::Span<const int32_t> device_group;    // its tensor-parallel group
};

// The attributes as comm's plans; InvalidArgument for a group table longer than the GEMM takes.
Status DecodeGemmPlan(const GemmPlanAttr& attr, GemmPlan* plan);
Status DecodeOverlapPlan(const OverlapPlanAttr& attr, OverlapPlan* plan);

// This device's rank and group from the mesh table; InvalidArgument when it is not there.
struct MeshPlace {
  int rank = -1;
  int group = -1;
};
Status FindInMesh(const MeshAttr& mesh, int32_t device, MeshPlace* place);

// The GEMM operands' element type as the kernels' dtype: bf16, f16 or float8_e4m3fn, else
// InvalidArgument.
Status GemmDtypeOf(xla::ffi::DataType type, GemmDtype* dtype);

}  // namespace fo_jax

XLA_FFI_REGISTER_ENUM_ATTR_DECODING(fo_jax::Collective);
XLA_FFI_REGISTER_ENUM_ATTR_DECODING(fo_jax::Transport);
XLA_FFI_REGISTER_ENUM_ATTR_DECODING(fo_jax::SumSplit);

XLA_FFI_REGISTER_STRUCT_ATTR_DECODING(
    fo_jax::GemmPlanAttr,
    ::xla::ffi::StructMember<int32_t>("config"),
    ::xla::ffi::StructMember<int32_t>("batch"),
    ::xla::ffi::StructMember<::xla::ffi::Span<const int32_t>>("group_begin"),
    ::xla::ffi::StructMember<int32_t>("sm_budget"));

XLA_FFI_REGISTER_STRUCT_ATTR_DECODING(
    fo_jax::OverlapPlanAttr,
    ::xla::ffi::StructMember<fo_jax::Collective>("collective"),
    ::xla::ffi::StructMember<fo_jax::Transport>("transport"),
    ::xla::ffi::StructMember<int32_t>("axis_size"),
    ::xla::ffi::StructMember<fo_jax::GemmPlanAttr>("gemm"),
    ::xla::ffi::StructMember<int32_t>("nccl_max_ctas"),
    ::xla::ffi::StructMember<int32_t>("rounds"),
    ::xla::ffi::StructMember<bool>("ring"),
    ::xla::ffi::StructMember<fo_jax::SumSplit>("sum_split"),
    ::xla::ffi::StructMember<int32_t>("tiles_chunk"));

XLA_FFI_REGISTER_STRUCT_ATTR_DECODING(
    fo_jax::MeshAttr,
    ::xla::ffi::StructMember<int32_t>("process"),
    ::xla::ffi::StructMember<::xla::ffi::Span<const int32_t>>("device_process"),
    ::xla::ffi::StructMember<::xla::ffi::Span<const int32_t>>("device_ordinal"),
    ::xla::ffi::StructMember<::xla::ffi::Span<const int32_t>>("device_rank"),
    ::xla::ffi::StructMember<::xla::ffi::Span<const int32_t>>("device_group"));
