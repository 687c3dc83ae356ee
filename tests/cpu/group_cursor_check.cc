// Host check of csrc/kernels/group_cursor.h (run by test_group_cursor.py): GroupCursor::find must
// answer exactly what a binary search of the table answers (the largest i < count with
// begin[i] <= x), for random non-decreasing tables with empty entries and for query sequences
// that stay, step to the next entry, jump ahead, go back, or leave the table's range.
// Prints "ok <lookups>" or the first disagreement, and exits 1 on one.
#include <cstdio>
#include <random>
#include <vector>

#include "kernels/group_cursor.h"

namespace {

int Search(const std::vector<int>& begin, int count, int x) {
  int l = 0, h = count - 1;
  while (l < h) {
    const int mid = (l + h + 1) >> 1;
    if (begin[mid] <= x) l = mid; else h = mid - 1;
  }
  return l;
}

}  // namespace

int main() {
  std::mt19937 rng(20261129);
  long lookups = 0;
  for (int table = 0; table < 20000; ++table) {
    const int count = 1 + int(rng() % 64);  // up to kMaxGemmGroups entries
    std::vector<int> begin(count + 1);
    int v = int(rng() % 3);
    for (int i = 0; i <= count; ++i) {
      begin[i] = v;
      if (rng() % 4 != 0) v += 1 + int(rng() % 5);  // a quarter of the entries empty
    }
    fo_jax::detail::GroupCursor cursor;
    int x = begin[0];
    for (int q = 0; q < 200; ++q) {
      switch (rng() % 6) {
        case 0: break;                                                       // stay
        case 1: x += 1; break;                                               // next row
        case 2: x += int(rng() % 8); break;                                  // a few ahead
        case 3: x -= int(rng() % 3); break;                                  // back
        case 4: x = begin[0] - 2 + int(rng() % (begin[count] - begin[0] + 5)); break;  // anywhere
        default: x = begin[int(rng() % (count + 1))]; break;                 // a boundary
      }
      const int got = cursor.find(begin.data(), count, x), want = Search(begin, count, x);
      ++lookups;
      if (got != want) {
        std::printf("table %d (count %d), lookup %d of x = %d: cursor %d, search %d\n", table,
                    count, q, x, got, want);
        return 1;
      }
    }
  }
  std::printf("ok %ld\n", lookups);
  return 0;
}
