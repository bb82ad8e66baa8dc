// xshard-plan pipeline: prints a pipeline schedule's table per rank, its bubble and its peak
// in-flight activations, from the same constexpr function the runtime uses.
//
//   xshard-plan pipeline --stages 4 --micro-batches 8 --schedule 1f1b [--virtual 2]
//
// Bad input gives one line on stderr and exit status 2.
#pragma once

#include <xshard/pipeline/analysis.hpp>

#include "plan_cli.hpp"

#include <cstdio>
#include <string>

namespace xshard_plan {

/// The closed form of the schedule's bubble, as text, or "" where there is none (ZB-H1
/// with fewer micro-batches than stages).
inline std::string closed_form(const xshard::pipeline::schedule_config& c) {
    const int p = c.stages, m = c.micro_batches, v = c.virtual_stages;
    const auto fraction = [](const char* formula, int num, int den) {
        char text[96];
        std::snprintf(text, sizeof text, "%s = %d/%d = %.4f", formula, num, den, double(num) / den);
        return std::string(text);
    };
    switch (c.kind) {
    case xshard::pipeline::schedule_kind::interleaved:
        return fraction("(p-1)/(v*m+p-1)", p - 1, v * m + p - 1);
    case xshard::pipeline::schedule_kind::zero_bubble:
        return m >= p ? fraction("(p-1)/(3*m+p-1)", p - 1, 3 * m + p - 1) : std::string();
    default:
        return fraction("(p-1)/(m+p-1)", p - 1, m + p - 1);
    }
}

/// `xshard-plan pipeline ...` (argv[0] is "pipeline"): returns the exit status.
inline int plan_pipeline(int argc, char** argv) {
    namespace pp = xshard::pipeline;
    CLI::App app{"xshard-plan pipeline: a pipeline schedule per rank, its bubble and peak "
                 "activations"};
    int stages = 0, micro_batches = 0, virtual_stages = 1;
    std::string schedule = "1f1b";
    app.add_option("--stages", stages, "pipeline stages p (ranks along the pipeline axis)")
        ->required();
    app.add_option("--micro-batches", micro_batches, "micro-batches m per step")->required();
    app.add_option("--schedule", schedule, "gpipe, 1f1b, interleaved or zero_bubble");
    app.add_option("--virtual", virtual_stages,
                   "virtual stages v per rank (the interleaved schedule; 2 if not given)");
    if (const auto status = parse_arguments(app, argc, argv))
        return *status;
    try {
        const auto kind = pp::parse_schedule(schedule);
        if (kind == pp::schedule_kind::interleaved && app.count("--virtual") == 0)
            virtual_stages = 2;
        const pp::schedule_config c{kind, stages, micro_batches, virtual_stages};
        const auto table = pp::make_schedule(c);
        const auto report = pp::analyze(table);
        std::printf("pipeline schedule %s: %d stages, %d micro-batches, %d virtual stage%s per "
                    "rank\n",
                    std::string(pp::name(kind)).c_str(), stages, micro_batches, virtual_stages,
                    virtual_stages == 1 ? "" : "s");
        std::printf("F<i>: forward of micro-batch i, B<i>: its backward%s%s; each F receives "
                    "from the previous stage and sends to the next, each B the reverse\n",
                    table.split_backward() ? " (input gradient), W<i>: its weight gradient" : "",
                    virtual_stages > 1 ? ", :s<k>: on virtual stage k" : "");
        for (int r = 0; r < stages; ++r) {
            std::string line = "rank " + std::to_string(r) + ":";
            for (const auto& a : table.ranks[r]) {
                line += ' ';
                line += pp::letter(a.kind);
                line += std::to_string(a.micro_batch);
                if (virtual_stages > 1)
                    line += ":s" + std::to_string(a.stage);
            }
            std::printf("%s\n", line.c_str());
        }
        std::printf("deadlock-free: %s\n", report.deadlock_free ? "yes (every receive is reached "
                                                                  "by its send)"
                                                                : report.problem.c_str());
        const auto form = closed_form(c);
        std::printf("bubble %.4f (%lld of %lld units of work idle, F = 1, B = %d%s)%s%s\n",
                    report.bubble(), static_cast<long long>(report.idle),
                    static_cast<long long>(report.total), table.split_backward() ? 1 : 2,
                    table.split_backward() ? ", W = 1" : "", form.empty() ? "" : "; ",
                    form.c_str());
        std::string peaks;
        for (int n : report.peak_in_flight)
            peaks += " " + std::to_string(n);
        std::printf("peak in-flight activations %d (per rank:%s)\n", report.peak(), peaks.c_str());
        return report.deadlock_free ? 0 : 1;
    } catch (const std::exception& e) {
        return report_failure(e);
    }
}

} // namespace xshard_plan
