#pragma once
/// \file
/// The definitions of what ops/operand.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/ops/operand.hpp>

namespace xshard {

namespace detail {

XSHARD_DECL void check_rule(const rule_result& r, const char* operation, bool may_redistribute) {
    if (may_redistribute && r.problem != rule_problem::rank_mismatch)
        return;
    raise_rule_problem(r.problem, operation);
}

} // namespace detail

} // namespace xshard

