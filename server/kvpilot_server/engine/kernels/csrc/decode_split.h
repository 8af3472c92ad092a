// Splitting decode attention's keys when a batch has too few sequences to keep every thread
// busy, and merging the parts (paged_decode.cpp runs the parts).
#pragma once
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace kvpilot {

// With fewer (sequence, kv head) tasks than twice the threads (batch 1 above all), each
// sequence's visible keys are split into `parts` (flash decoding): every thread gets work, and
// a merge weighs the parts' outputs by their shares of the softmax. Each part keeps at least
// kMinPart keys, so a short context is not split into parts costing more to merge than to run.
constexpr int64_t kMinPart = 128;

struct Split {
  int64_t parts;
  std::vector<float> out, stats;  // [D, kvh, parts, group, hd] and [D, kvh, parts, group, 2]

  Split(int64_t D, int64_t H, int64_t kvh, int64_t hd, int64_t longest) {
    const int64_t tasks = D * kvh, threads = omp_get_max_threads();
    parts = tasks >= 2 * threads ? 1 : (2 * threads + tasks - 1) / tasks;
    parts = std::max<int64_t>(1, std::min(parts, longest / kMinPart));
    if (parts > 1) {
      out.resize(D * H * parts * hd);
      stats.resize(D * H * parts * 2);
    }
  }

  // Each row's heads: the parts' outputs summed by e^(max - overall max), over the same sum of
  // their totals. A part with no keys (a window, a short row) has a total of 0 and counts not.
  void merge(float* op, int64_t D, int64_t H, int64_t kvh, int64_t hd) const {
    const int64_t group = H / kvh;
#pragma omp parallel for
    for (int64_t row_head = 0; row_head < D * H; ++row_head) {
      const int64_t d = row_head / H, kv = row_head % H / group, head = row_head % group;
      auto at = [&](int64_t p) { return ((d * kvh + kv) * parts + p) * group + head; };
      float top = -INFINITY, total = 0.0f;
      for (int64_t p = 0; p < parts; ++p)
        if (stats[2 * at(p) + 1] > 0.0f) top = std::max(top, stats[2 * at(p)]);
      float* o = op + row_head * hd;
      std::fill(o, o + hd, 0.0f);
      for (int64_t p = 0; p < parts; ++p) {
        if (stats[2 * at(p) + 1] <= 0.0f) continue;
        const float w = std::exp(stats[2 * at(p)] - top);
        total += w * stats[2 * at(p) + 1];
        const float* part = out.data() + at(p) * hd;
        for (int64_t i = 0; i < hd; ++i) o[i] += w * part[i];
      }
      if (total > 0.0f)
        for (int64_t i = 0; i < hd; ++i) o[i] /= total;
    }
  }
};

}  // namespace kvpilot
