#pragma once

namespace lockstep::comm {

// Element-wise reductions. Mean is Sum followed by one scaling by 1/N.
// NaN: Sum and Mean give NaN wherever any rank has one. Max and Min give NaN
// too (of several NaNs, the one with the largest bit pattern), and count +0
// as larger than -0, so their result is the same bits whatever order an
// algorithm combines the ranks in: on every rank, and with every algorithm of
// lockstep's own (Algorithm::Native is the transport library's, whose rules
// are its own).
enum class ReduceOp { Sum, Mean, Max, Min };

}  // namespace lockstep::comm
