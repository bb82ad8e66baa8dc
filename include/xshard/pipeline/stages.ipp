#pragma once
/// \file
/// The definitions of what pipeline/stages.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/pipeline/stages.hpp>

namespace xshard::pipeline {

namespace detail {

XSHARD_DECL std::string name_list(const std::vector<std::string>& names) {
    std::string out;
    for (const auto& n : names)
        out += (out.empty() ? "" : ", ") + n;
    return out;
}

XSHARD_DECL void check_stages(const std::vector<std::string>& names,
                              const std::vector<int>& stage_of, int stages) {
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

XSHARD_DECL std::vector<std::string_view> key_forms(std::string_view key) {
    constexpr std::string_view backbone = "_backbone";
    std::vector<std::string_view> forms{key};
    if (key == backbone)
        forms.emplace_back();
    else if (key.starts_with(backbone) && key.size() > backbone.size() &&
             key[backbone.size()] == '.')
        forms.push_back(key.substr(backbone.size() + 1));
    return forms;
}

} // namespace detail

XSHARD_DECL std::vector<int> stages_by_name(const std::vector<std::string>& names,
                                            const std::map<std::string, int>& config, int stages) {
    const std::size_t n = names.size();
    std::vector<int> out(n, 0);
    std::vector<std::size_t> specific(n, 0); // the length + 1 of the path that set out[i]
    std::vector<std::vector<std::pair<std::string, int>>> inner(n); // parts of module i
    for (const auto& [key, stage] : config) {
        bool found = false;
        for (const auto form : detail::key_forms(key)) {
            for (std::size_t i = 0; i < n; ++i)
                if (detail::covers(form, names[i])) {
                    found = true;
                    if (form.size() + 1 > specific[i]) {
                        specific[i] = form.size() + 1;
                        out[i] = stage;
                    }
                } else if (detail::covers(names[i], form)) {
                    found = true;
                    inner[i].emplace_back(key, stage);
                }
            if (found)
                break;
        }
        if (!found)
            throw error("xshard: pipeline: stage_config names an unknown module '" + key +
                        "' (the chain's modules: " + detail::name_list(names) + ")");
    }
    for (std::size_t i = 0; i < n; ++i) {
        for (const auto& [key, stage] : inner[i])
            if (stage != inner[i].front().second)
                throw error("xshard: pipeline: stage_config gives '" + inner[i].front().first +
                            "' stage " + std::to_string(inner[i].front().second) + " and '" + key +
                            "' stage " + std::to_string(stage) + ", parts of module '" + names[i] +
                            "': a pipeline cuts between the chain's modules only");
        if (!inner[i].empty())
            out[i] = inner[i].front().second;
        else if (specific[i] == 0) // not named
            out[i] = i > 0 ? out[i - 1] : 0;
    }
    detail::check_stages(names, out, stages);
    return out;
}

XSHARD_DECL std::vector<int> stages_by_position(const std::vector<std::string>& names,
                                                const std::vector<std::size_t>& starts,
                                                int stages) {
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

XSHARD_DECL std::vector<int> stages_by_cost(const std::vector<std::string>& names,
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

