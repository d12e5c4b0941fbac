// Bucket assignment (Note [Bucket assignment] in lockstep/ddp/reducer.h).
//
// Walk the tensors from last to first, the order backward makes them ready.
// Each joins the open bucket; the bucket closes once it holds at least its
// cap. Because the tensors sit back to back in the gradient span and are
// taken in reverse, every bucket is one contiguous range of it.
//
// Example, the default MLP 784-512-512-10 (4 B per float), caps 1 MiB / 25 MiB:
//   bucket 0: 4.bias 4.weight 2.bias 2.weight   (20 KiB + 2 KiB + 1 MiB: closes)
//   bucket 1: 0.bias 0.weight                   (1.5 MiB, the first layer)
#include <cstdio>

#include "lockstep/ddp/reducer.h"
#include "lockstep/error.h"

namespace lockstep::ddp {

std::vector<Bucket> assign_buckets(std::span<const std::size_t> tensor_numels, std::size_t first_bucket_bytes,
                                   std::size_t bucket_bytes) {
  std::size_t total = 0;
  for (auto n : tensor_numels) total += n;
  std::vector<Bucket> buckets;
  std::size_t end = total;  // the open bucket covers [offset, end)
  Bucket open;
  for (std::size_t t = tensor_numels.size(); t-- > 0;) {
    end -= tensor_numels[t];
    open.tensors.push_back(t);
    open.offset = end;
    open.numel += tensor_numels[t];
    const std::size_t cap = buckets.empty() ? first_bucket_bytes : bucket_bytes;
    if (bucket_bytes > 0 && open.bytes() >= cap) {
      buckets.push_back(std::move(open));
      open = Bucket{};
    }
  }
  if (!open.tensors.empty()) {
    open.offset = end;
    buckets.push_back(std::move(open));
  }
  return buckets;
}

std::string describe_buckets(const std::vector<Bucket>& buckets, std::span<const std::string> tensor_names) {
  std::string s;
  for (std::size_t k = 0; k < buckets.size(); ++k) {
    char head[64];
    std::snprintf(head, sizeof head, "bucket %zu: %.2f MiB, tensors", k,
                  double(buckets[k].bytes()) / (1 << 20));
    s += head;
    for (auto t : buckets[k].tensors) {
      s += ' ';
      s += t < tensor_names.size() ? tensor_names[t] : std::to_string(t);
    }
    s += '\n';
  }
  return s;
}

}  // namespace lockstep::ddp
