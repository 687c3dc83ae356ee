// Host check of csrc/kernels/group_cursor.h (run by test_group_cursor.py): LastEntryAtMost and
// GroupCursor::find must both answer the largest i < count with begin[i] <= x (0 if none; here
// from std::upper_bound), for random non-decreasing tables with empty entries and for query
// sequences that stay, step to the next entry, jump ahead, go back, or leave the table's range.
// Prints "ok <lookups>" or the first disagreement, and exits 1 on one.
#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

#include "kernels/group_cursor.h"

namespace {

int Reference(const std::vector<int>& begin, int count, int x) {
  const int after = int(std::upper_bound(begin.begin(), begin.begin() + count, x) - begin.begin());
  return after > 0 ? after - 1 : 0;
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
      const int want = Reference(begin, count, x);
      const int searched = fo_jax::detail::LastEntryAtMost(begin.data(), count, x);
      const int got = cursor.find(begin.data(), count, x);
      ++lookups;
      if (got != want || searched != want) {
        std::printf("table %d (count %d), lookup %d of x = %d: cursor %d, search %d, want %d\n",
                    table, count, q, x, got, searched, want);
        return 1;
      }
    }
  }
  std::printf("ok %ld\n", lookups);
  return 0;
}
