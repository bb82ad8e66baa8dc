#pragma once
/// \file
/// The definitions of what train/hsdp_units.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/train/hsdp_units.hpp>

namespace xshard {

namespace detail {

XSHARD_DECL hsdp_units::hsdp_units(std::vector<hsdp_entry> &entries,
                                   hsdp_timings &timings, int level)
    : entries_(&entries), timings_(&timings), level_(level) {}

XSHARD_DECL std::optional<std::size_t> hsdp_units::find(const std::string& prefix) const {
    const auto it = index_.find(prefix);
    if (it == index_.end())
        return std::nullopt;
    return it->second;
}

XSHARD_DECL hsdp_unit& hsdp_units::of_weight(const std::string& name) {
    const auto p = name.substr(0, name.find('.'));
    if (const auto u = find(p))
        return units_[*u];
    index_[p] = units_.size();
    units_.push_back({});
    units_.back().prefix = p;
    return units_.back();
}

XSHARD_DECL void hsdp_units::plan(const hsdp_spaces& spaces, int& next_tag) {
    for (auto& u : units_) {
        u.gathers = plan_hsdp_exchanges_by_type(*entries_, spaces, u.members, true, next_tag,
                                                level_ == 3);
        if (level_ >= 2)
            u.scatters = plan_hsdp_exchanges_by_type(*entries_, spaces, u.members, false,
                                                     next_tag, level_ == 3);
    }
}

XSHARD_DECL void hsdp_units::start_gather(std::size_t u) {
    auto& unit = units_[u];
    if (level_ != 3 || unit.present)
        return;
    const auto t = hsdp_clock::now();
    for (std::size_t i : unit.members)
        entry(i).allocate_value();
    for (auto& f : unit.gathers)
        f.start();
    unit.present = unit.gathering = true;
    timings_->gather_wait += seconds_since(t);
}

XSHARD_DECL void hsdp_units::ensure_gathered(std::size_t u) {
    if (level_ != 3)
        return;
    start_gather(u);
    auto& unit = units_[u];
    if (!unit.gathering)
        return;
    const auto t = hsdp_clock::now();
    for (auto& f : unit.gathers)
        f.finish();
    unit.gathering = false;
    timings_->gather_wait += seconds_since(t);
}

XSHARD_DECL void hsdp_units::gather_all(bool grads) {
    for (std::size_t u = 0; u < units_.size(); ++u)
        start_gather(u);
    for (std::size_t u = 0; u < units_.size(); ++u) {
        ensure_gathered(u);
        if (grads)
            allocate_grads(u);
    }
}

XSHARD_DECL void hsdp_units::release_values(std::size_t u) {
    auto& unit = units_[u];
    if (level_ != 3 || !unit.present || unit.gathering || unit.user)
        return;
    for (std::size_t i : unit.members)
        entry(i).release_value();
    unit.present = false;
}

XSHARD_DECL void hsdp_units::allocate_grads(std::size_t u) {
    if (level_ != 3)
        return;
    for (std::size_t i : units_[u].members)
        entry(i).allocate_grad();
}

XSHARD_DECL void hsdp_units::start_reductions(std::size_t u) {
    auto& unit = units_[u];
    const auto t = hsdp_clock::now();
    bool terms = level_ >= 2 && !unit.members.empty();
    for (std::size_t i : unit.members)
        terms = terms && entry(i).terms();
    if (terms) {
        for (auto& f : unit.scatters)
            f.start();
        unit.scattering = true;
    }
    if (ready_)
        for (const auto& name : unit.allreduced)
            ready_->ready(name);
    if (level_ == 3)
        for (std::size_t i : unit.members)
            entry(i).release_grad(); // packed by start
    timings_->reduce_wait += seconds_since(t);
}

XSHARD_DECL void hsdp_units::start_all_reductions() {
    for (std::size_t u = units_.size(); u-- > 0;) {
        start_reductions(u);
        release_values(u);
    }
}

XSHARD_DECL void hsdp_units::finish_reductions(std::size_t u) {
    auto& unit = units_[u];
    if (!unit.scattering)
        return;
    for (auto& f : unit.scatters)
        f.finish();
    unit.scattering = false;
    for (std::size_t i : unit.members)
        entry(i).reduced = true;
}

XSHARD_DECL void hsdp_units::progress() {
    for (auto& unit : units_) {
        if (unit.gathering)
            for (auto& f : unit.gathers)
                (void)f.test();
        if (unit.scattering)
            for (auto& f : unit.scatters)
                (void)f.test();
    }
}

XSHARD_DECL void hsdp_units::finish_all() {
    for (auto& unit : units_) {
        if (unit.gathering) {
            for (auto& f : unit.gathers)
                f.finish();
            unit.gathering = false;
        }
        if (unit.scattering) {
            for (auto& f : unit.scatters)
                f.finish();
            unit.scattering = false;
        }
    }
}

XSHARD_DECL void hsdp_units::materialize() {
    const auto t = hsdp_clock::now();
    for (std::size_t u = 0; u < units_.size(); ++u) {
        ensure_gathered(u);
        units_[u].user = true;
    }
    timings_->gather_wait += seconds_since(t);
}

XSHARD_DECL void hsdp_units::begin_forward() {
    if (level_ != 3)
        return;
    finish_all();
    const auto t = hsdp_clock::now();
    for (std::size_t u = 0; u < units_.size(); ++u)
        if (units_[u].user) {
            for (std::size_t i : units_[u].members)
                entry(i).refresh();
            units_[u].user = false;
            release_values(u);
        }
    timings_->local_copies += seconds_since(t);
}

} // namespace detail
} // namespace xshard
