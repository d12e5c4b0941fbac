#pragma once

namespace lockstep::comm {

// Element-wise reductions. Mean is Sum followed by one scaling by 1/N.
enum class ReduceOp { Sum, Mean, Max, Min };

}  // namespace lockstep::comm
