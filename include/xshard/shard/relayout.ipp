#pragma once
/// \file
/// The definitions of what shard/relayout.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/shard/relayout.hpp>

namespace xshard::detail {

XSHARD_DECL void note(const call_log& log, const slot& s, const char* what, const layout& from,
                      const layout& to, const std::string& plan) {
    if (!log.report)
        return;
    *log.report += s.label() + what + ": " + from.to_string();
    if (from == to)
        *log.report += " (kept)\n";
    else
        *log.report += " -> " + to.to_string() + "\n" + plan;
}

} // namespace xshard::detail

