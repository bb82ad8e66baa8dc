#pragma once
/// \file
/// The definitions of what search/search_result.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/search/search_result.hpp>

namespace xshard {

namespace detail {

XSHARD_DECL std::string ms(double s) {
    char t[32];
    std::snprintf(t, sizeof t, "%.3f ms", s * 1e3);
    return t;
}

XSHARD_DECL std::string gib(double b) {
    char t[32];
    if (b >= double(1ULL << 30))
        std::snprintf(t, sizeof t, "%.2f GiB", b / double(1ULL << 30));
    else
        std::snprintf(t, sizeof t, "%.2f MiB", b / double(1ULL << 20));
    return t;
}

XSHARD_DECL std::string degrees_text(const parallel_degrees& d) {
    return "dp=" + std::to_string(d.dp) + " tp=" + std::to_string(d.tp) +
           " pp=" + std::to_string(d.pp) + " micro_batches=" + std::to_string(d.micro_batches) +
           " hsdp=" + (d.hsdp_level ? "level" + std::to_string(d.hsdp_level) : "off");
}

XSHARD_DECL std::string why_lost(const searched_strategy& winner, const searched_strategy& loser,
                                 int level) {
    if (level == 1 && loser.memory_bytes > winner.memory_bytes)
        return "needs " + gib(loser.memory_bytes - winner.memory_bytes) + " more per rank";
    if (level == 0) {
        const double a = winner.communication_seconds + winner.synchronization_seconds;
        const double b = loser.communication_seconds + loser.synchronization_seconds;
        if (b > a)
            return "communicates " + ms(b - a) + " more per step";
    }
    const double dt = loser.step_seconds - winner.step_seconds;
    if (dt <= 0)
        return "equal predicted step time; ranked after by memory (" + gib(loser.memory_bytes) +
               " vs " + gib(winner.memory_bytes) + ")";
    const std::pair<const char*, double> parts[] = {
        {"compute", loser.compute_seconds - winner.compute_seconds},
        {"activation redistribution", loser.communication_seconds - winner.communication_seconds},
        {"gradient synchronisation and update",
         loser.synchronization_seconds - winner.synchronization_seconds},
        {"pipeline bubble and transfers", loser.pipeline_seconds - winner.pipeline_seconds}};
    const auto* worst = &parts[0];
    for (const auto& p : parts)
        if (p.second > worst->second)
            worst = &p;
    return ms(dt) + " slower per step, mostly " + worst->first + " (+" + ms(worst->second) + ")";
}

} // namespace detail

XSHARD_DECL std::string describe(const search_result& r, const network_spec& net) {
    using detail::gib, detail::ms;
    std::string s;
    const char* objective[] = {"least communication (level 0)", "least memory (level 1)",
                               "fastest (level 2)"};
    s += "search (recursive_programming) for " + net.description + ", batch " +
         std::to_string(net.batch) + ", objective " + objective[r.level] + ", memory cap " +
         (std::isinf(r.memory_cap) ? std::string("none") : gib(r.memory_cap)) + "; " +
         std::to_string(r.candidates) + " candidate degrees\n";
    if (!r.best) {
        s += "no strategy fits the memory cap; the least memory any needs is " +
             gib(r.over_cap->memory_bytes) + " per rank (" +
             detail::degrees_text(r.over_cap->degrees) + ")\n";
        return s;
    }
    const auto& b = *r.best;
    s += "chosen: " + detail::degrees_text(b.degrees) + "\n";
    for (std::size_t i = 0; i < net.ops.size(); ++i) {
        const auto& c = b.choices[i];
        char line[256];
        const bool weighted =
            net.ops[i].kind == op_kind::linear || net.ops[i].kind == op_kind::embedding;
        std::snprintf(line, sizeof line, "  %-20s stage %d  in %-14s weight %-8s out %s\n",
                      net.ops[i].name.c_str(), b.stage_of[i], std::string(to_string(c.in)).c_str(),
                      weighted ? weight_layout(c.weight).to_string().c_str() : "-",
                      std::string(to_string(c.out)).c_str());
        s += line;
    }
    s += "predicted step " + ms(b.step_seconds) + " (compute " + ms(b.compute_seconds) +
         ", activation redistribution " + ms(b.communication_seconds) +
         ", gradient synchronisation and update " + ms(b.synchronization_seconds) + ", pipeline " +
         ms(b.pipeline_seconds) + "); memory " + gib(b.memory_bytes) + " per rank; communication " +
         gib(b.comm_bytes) + " sent per rank per step\n";
    if (r.runner_up)
        s += "runner-up: " + detail::degrees_text(r.runner_up->degrees) + ", step " +
             ms(r.runner_up->step_seconds) + ", memory " + gib(r.runner_up->memory_bytes) +
             ": lost by " + r.runner_up_lost + "\n";
    if (r.over_cap)
        s += "ruled out by the memory cap: " + detail::degrees_text(r.over_cap->degrees) +
             ", step " + ms(r.over_cap->step_seconds) + ", needs " + gib(r.over_cap->memory_bytes) +
             " per rank\n";
    return s;
}

} // namespace xshard

