// Which entry of a non-decreasing table holds a value: the binary search (LastEntryAtMost, the
// GEMM scheduler's lookup of its unit table) and GroupCursor, which remembers its last answer
// (the signaling epilogue's lookup of a tile-row's group). Included by the signaling GEMM's
// scheduler and epilogue, and by the host test (tests/cpu/test_group_cursor.py), so it needs no
// CUDA or CUTLASS header.
#pragma once

#include <climits>

#if defined(__CUDACC__)
#define FO_JAX_CURSOR_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FO_JAX_CURSOR_HOST_DEVICE inline
#endif

namespace fo_jax::detail {

// Entry i of the table begin[0 .. count] (non-decreasing, count >= 1) is [begin[i], begin[i+1]).
// The largest i < count with begin[i] <= x (0 if none), so an empty entry is never the answer
// unless it is the last.
FO_JAX_CURSOR_HOST_DEVICE int LastEntryAtMost(const int* begin, int count, int x) {
  int l = 0, h = count - 1;
  while (l < h) {
    const int mid = (l + h + 1) >> 1;
    if (begin[mid] <= x) l = mid; else h = mid - 1;
  }
  return l;
}

// find(begin, count, x) answers LastEntryAtMost(begin, count, x).
//
// Why a cursor: the epilogue looks up the group of each tile's row when the kernel signals, and a
// CTA's tiles visit the groups in order, so consecutive lookups mostly land in the entry of the
// previous one or in the next. The cursor keeps that entry's range and the next entry's end in
// registers: those lookups load nothing, and the advance loads the end after next, which only
// the lookup after it needs. Anything else runs the binary search. In a cooperative kernel the
// lookup sits between two tiles' main loops, on the consumers' path, where each step of a search
// is a dependent constant load (docs/gemm_performance.md, "The producer's signals"). (The
// scheduler's search of its unit table stays a search: a cursor there costs the fp8 cooperative
// kernel spilled registers.)
struct GroupCursor {
  int index = 0;
  int lo = INT_MAX, hi = INT_MIN;  // entry `index` (empty before the first lookup)
  int next_hi = INT_MIN;           // the end of entry index + 1 (== hi when there is none)

  FO_JAX_CURSOR_HOST_DEVICE int find(const int* begin, int count, int x) {
    if (x >= lo && x < hi) return index;
    if (x >= hi && x < next_hi) {
      ++index;
      lo = hi;
      hi = next_hi;
      next_hi = index + 2 <= count ? begin[index + 2] : hi;
      return index;
    }
    index = LastEntryAtMost(begin, count, x);
    lo = begin[index];
    hi = begin[index + 1];
    next_hi = index + 2 <= count ? begin[index + 2] : hi;
    return index;
  }
};

}  // namespace fo_jax::detail
