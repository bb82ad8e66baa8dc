#pragma once
/// \file
/// Which (virtual) stage each layer of a chain runs on: by module name (MindSpore's
/// `stage_config`), by position (the index where each stage starts), or balanced by cost
/// (parameters per layer; for dense layers a layer's FLOPs are 2 x rows x parameters, so
/// the same cut). Pure functions of sizes and names, the same on every rank; misuse throws
/// `xshard::error` with a sentence.

#include <xshard/comm/error.hpp>

#include <algorithm>
#include <cstddef>
#include <limits>
#include <map>
#include <string>
#include <vector>

namespace xshard::pipeline {

namespace detail {

inline std::string name_list(const std::vector<std::string>& names) {
    std::string out;
    for (const auto& n : names)
        out += (out.empty() ? "" : ", ") + n;
    return out;
}

/// Throws unless `stage_of` runs along the chain (never back) and gives every stage of
/// 0 .. stages - 1 at least one layer.
inline void check_stages(const std::vector<std::string>& names, const std::vector<int>& stage_of,
                         int stages) {
    std::vector<int> count(std::size_t(std::max(stages, 0)), 0);
    for (std::size_t i = 0; i < stage_of.size(); ++i) {
        if (stage_of[i] < 0 || stage_of[i] >= stages)
            throw error("xshard: pipeline: module '" + names[i] + "' is given stage " +
                        std::to_string(stage_of[i]) + " of a pipeline of " +
                        std::to_string(stages) + " stages");
        if (i > 0 && stage_of[i] < stage_of[i - 1])
            throw error("xshard: pipeline: module '" + names[i] + "' (stage " +
                        std::to_string(stage_of[i]) + ") follows '" + names[i - 1] + "' (stage " +
                        std::to_string(stage_of[i - 1]) + "): stages must run along the chain");
        ++count[std::size_t(stage_of[i])];
    }
    for (int s = 0; s < stages; ++s)
        if (count[std::size_t(s)] == 0)
            throw error("xshard: pipeline: stage " + std::to_string(s) + " of " +
                        std::to_string(stages) + " has no layers (the chain has " +
                        std::to_string(names.size()) + " modules: " + name_list(names) + ")");
}

} // namespace detail

/// Stages from names (MindSpore's stage_config): `config[name]` is the stage of the chain's
/// module `name`; a module not named takes the stage of the one before it (the first,
/// stage 0). Throws for a name that is not a module of the chain, and (see check) for
/// stages that go back or stay empty.
inline std::vector<int> stages_by_name(const std::vector<std::string>& names,
                                       const std::map<std::string, int>& config, int stages) {
    for (const auto& [name, stage] : config)
        if (std::find(names.begin(), names.end(), name) == names.end())
            throw error("xshard: pipeline: stage_config names an unknown module '" + name +
                        "' (the chain's modules: " + detail::name_list(names) + ")");
    std::vector<int> out(names.size(), 0);
    for (std::size_t i = 0; i < names.size(); ++i) {
        const auto it = config.find(names[i]);
        out[i] = it != config.end() ? it->second : (i > 0 ? out[i - 1] : 0);
    }
    detail::check_stages(names, out, stages);
    return out;
}

/// Stages by position: stage s starts at layer `starts[s - 1]` (stage 0 at layer 0), so
/// `starts` has stages - 1 increasing entries.
inline std::vector<int> stages_by_position(const std::vector<std::string>& names,
                                           const std::vector<std::size_t>& starts, int stages) {
    if (int(starts.size()) != stages - 1)
        throw error("xshard: pipeline: " + std::to_string(stages) + " stages need " +
                    std::to_string(stages - 1) + " stage starts, not " +
                    std::to_string(starts.size()));
    std::vector<int> out(names.size(), 0);
    for (std::size_t i = 0; i < names.size(); ++i)
        out[i] = int(std::upper_bound(starts.begin(), starts.end(), i) - starts.begin());
    detail::check_stages(names, out, stages);
    return out;
}

/// Stages balanced by cost: the cut of the chain into `stages` non-empty runs whose largest
/// total cost is smallest (ties: the earliest cuts). Throws when there are fewer layers than
/// stages.
inline std::vector<int> stages_by_cost(const std::vector<std::string>& names,
                                       const std::vector<double>& cost, int stages) {
    const std::size_t n = names.size(), k = std::size_t(std::max(stages, 1));
    if (n < k)
        throw error("xshard: pipeline: " + std::to_string(k) + " stages need at least " +
                    std::to_string(k) + " modules; the chain has " + std::to_string(n) + " (" +
                    detail::name_list(names) + ")");
    std::vector<double> prefix(n + 1, 0.0);
    for (std::size_t i = 0; i < n; ++i)
        prefix[i + 1] = prefix[i] + cost[i];
    constexpr double inf = std::numeric_limits<double>::infinity();
    // best[j][i]: the smallest largest run cost of layers 0 .. i-1 in j runs; cut[j][i]: where
    // the last run starts.
    std::vector<std::vector<double>> best(k + 1, std::vector<double>(n + 1, inf));
    std::vector<std::vector<std::size_t>> cut(k + 1, std::vector<std::size_t>(n + 1, 0));
    best[0][0] = 0;
    for (std::size_t j = 1; j <= k; ++j)
        for (std::size_t i = j; i <= n; ++i)
            for (std::size_t start = j - 1; start < i; ++start) {
                const double v = std::max(best[j - 1][start], prefix[i] - prefix[start]);
                if (v < best[j][i]) {
                    best[j][i] = v;
                    cut[j][i] = start;
                }
            }
    std::vector<int> out(n, 0);
    for (std::size_t j = k, i = n; j > 0; --j) {
        const std::size_t start = cut[j][i];
        for (std::size_t l = start; l < i; ++l)
            out[l] = int(j - 1);
        i = start;
    }
    detail::check_stages(names, out, stages);
    return out;
}

} // namespace xshard::pipeline
