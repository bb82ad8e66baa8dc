#pragma once
/// \file
/// The redistribution prices of the strategy search, in one process without MPI: what the
/// redistribution planner's route from one layout to another costs the slowest rank under the
/// alpha-beta `cost_model`. redistribution_plan runs the cheapest of its candidates and of the
/// routes through intermediate layouts (redistribute/route.hpp), a shortest path, so a direct
/// redistribution never costs more than a detour (tests/redistribute/test_planner.cpp checks
/// it on random layout triples) and the price is what a run does; `route` names the layouts it
/// passes through.

#include <xshard/compiled.hpp>
#include <xshard/core/layout.hpp>
#include <xshard/core/mesh_shape.hpp>
#include <xshard/redistribute/cost_model.hpp>
#include <xshard/redistribute/geometry.hpp>
#include <xshard/redistribute/planner.hpp>
#include <xshard/redistribute/route.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace xshard {

/// The price of one redistribution for the slowest rank: seconds and bytes sent.
struct redistribution_price {
    double seconds = 0;
    std::size_t bytes = 0;
};

/// Prices redistributions of [rows, features] activations on one (dp, tp) mesh with the
/// planner's candidates and the alpha-beta model, memoised, closed under composition through
/// the search's activation layouts and their duals (see the file comment). No MPI.
class redistribution_pricer {
public:
    redistribution_pricer(const mesh_shape& mesh, const cost_model& model, std::size_t element)
        : mesh_(mesh)
        , model_(model)
        , element_(element)
        , ranks_(sample_ranks()) {}

    /// The planner's price of `from` -> `to` (redistribution_plan's choice, route.hpp: the
    /// cheapest of its candidates and of the routes through intermediate layouts), for the
    /// slowest of `sample_ranks` per step.
    template <std::size_t N>
    redistribution_price direct(const layout& from, const layout& to,
                                const std::array<std::size_t, N>& shape) const {
        return price_of(planned(from, to, shape), shape);
    }

    /// The seconds of `direct` without its bytes: the price `choose_route` computes as it
    /// chooses, so nothing is priced twice.
    template <std::size_t N>
    double seconds(const layout& from, const layout& to,
                   const std::array<std::size_t, N>& shape) const {
        if (from == to)
            return 0;
        return choose_route(plan_redistribution(from, to), mesh_, shape, element_, model_, {},
                            ranks_)
            .seconds;
    }

    /// The steps of the planner's route `from` -> `to`.
    template <std::size_t N>
    step_list planned(const layout& from, const layout& to,
                      const std::array<std::size_t, N>& shape) const {
        if (from == to)
            return {};
        return choose_route(plan_redistribution(from, to), mesh_, shape, element_, model_, {},
                            ranks_)
            .steps;
    }

    /// `direct`, memoised per layouts and shape.
    template <std::size_t N>
    redistribution_price direct_memo(const layout& from, const layout& to,
                                     const std::array<std::size_t, N>& shape) {
        auto key = std::make_tuple(from.to_string(), to.to_string(),
                                   std::vector<std::size_t>(shape.begin(), shape.end()));
        if (auto it = memo_.find(key); it != memo_.end())
            return it->second;
        return memo_.emplace(std::move(key), direct(from, to, shape)).first->second;
    }

    /// The price of `from` -> `to` for a [rows, features] tensor: the planner's (`direct`),
    /// memoised. A distance: price(a, c) <= price(a, b) + price(b, c) (route.hpp).
    redistribution_price operator()(const layout& from, const layout& to, std::size_t rows,
                                    std::size_t features) {
        if (from == to)
            return {};
        return direct_memo(from, to, std::array<std::size_t, 2>{rows, features});
    }

    /// The layouts the planner's route `from` -> `to` passes through, both ends included.
    std::vector<layout> route(const layout& from, const layout& to, std::size_t rows,
                              std::size_t features) const;

    const mesh_shape& mesh() const noexcept { return mesh_; }
    const cost_model& model() const noexcept { return model_; }

    /// The ranks priced: every rank of a mesh of at most 64, else its corner ranks (those
    /// whose coordinates are 0, 1, the middle or the last on every axis).
    std::vector<int> sample_ranks() const;

private:
    mesh_shape mesh_;
    cost_model model_;
    std::size_t element_;
    std::vector<int> ranks_;
    template <std::size_t N>
    redistribution_price price_of(const step_list& steps,
                                  const std::array<std::size_t, N>& shape) const {
        redistribution_price p;
        for (const auto& s : steps) {
            p.seconds += price_step(s, mesh_, shape, element_, ranks_, model_).first;
            std::size_t sent = 0;
            for (int r : ranks_) {
                step_list one;
                one.push_back(s);
                sent =
                    std::max(sent, summarize(one, mesh_, shape, element_, r, model_).bytes_sent());
            }
            p.bytes += sent;
        }
        return p;
    }

    std::map<std::tuple<std::string, std::string, std::vector<std::size_t>>, redistribution_price>
        memo_;
};

} // namespace xshard

#ifndef XSHARD_SEPARATE_COMPILATION
#include <xshard/search/redistribution_pricer.ipp>
#endif
