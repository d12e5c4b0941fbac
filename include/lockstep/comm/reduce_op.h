#pragma once

namespace lockstep::comm {

// Element-wise reductions. Mean is Sum followed by one scaling by 1/N.
// NaN: Sum and Mean give NaN wherever any rank has one. Max and Min compare
// with < (as std::max does), so where some ranks hold NaN the result depends
// on the order the algorithm combines ranks in: it may be NaN or the extreme
// of the other values, and can differ between algorithms and even between
// the ranks of one call. Check for NaN before a Max or Min.
enum class ReduceOp { Sum, Mean, Max, Min };

}  // namespace lockstep::comm
