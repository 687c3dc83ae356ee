// GroupCursor: which entry of a non-decreasing table holds a value, remembered between lookups.
// Included by the signaling GEMM's epilogue, and by its host test (tests/cpu/test_group_cursor.py),
// so it needs no CUDA or CUTLASS header.
#pragma once

#include <climits>

#if defined(__CUDACC__)
#define FO_JAX_CURSOR_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FO_JAX_CURSOR_HOST_DEVICE inline
#endif

namespace fo_jax::detail {

// Entry i of the table begin[0 .. count] (non-decreasing, count >= 1) is [begin[i], begin[i+1]).
// find(begin, count, x) is the largest i < count with begin[i] <= x (0 if none), as a binary
// search over the table finds it, so an empty entry is never the answer unless it is the last.
//
// Why a cursor: the epilogue looks up the group of each tile's row when the kernel signals, and a
// CTA's tiles visit the groups in order, so consecutive lookups mostly land in the entry of the
// previous one or in the next. The cursor keeps that entry's range and the next entry's end in
// registers: those lookups load nothing, and the advance loads the end after next, which only
// the lookup after it needs. Anything else runs the binary search. In a cooperative kernel the
// lookup sits between two tiles' main loops, on the consumers' path, where each step of a search
// is a dependent constant load (docs/performance.md, "fp8"). (The scheduler's search of its
// unit table stays a search: a cursor there costs the fp8 cooperative kernel spilled registers.)
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
    int l = 0, h = count - 1;
    while (l < h) {
      const int mid = (l + h + 1) >> 1;
      if (begin[mid] <= x) l = mid; else h = mid - 1;
    }
    index = l;
    lo = begin[l];
    hi = begin[l + 1];
    next_hi = l + 2 <= count ? begin[l + 2] : hi;
    return index;
  }
};

}  // namespace fo_jax::detail
