#pragma once
/// \file
/// The definitions of what io/operator_strategy_file.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/io/operator_strategy_file.hpp>

namespace xshard {

XSHARD_DECL std::vector<op_choice> operator_strategy::choices() const {
    std::vector<op_choice> c;
    for (const auto& o : operators)
        c.push_back(o.choice);
    return c;
}

XSHARD_DECL std::string operator_strategy::to_json() const {
    nlohmann::json j;
    detail::write_envelope(
        j, kind,
        detail::mesh_json<nlohmann::json>(std::vector<std::string>{"dp", "tp"},
                                          std::vector<int>{degrees.dp, degrees.tp}));
    j["network"] = network;
    j["batch"] = batch;
    j["ranks"] = ranks;
    j["degrees"] = {{"dp", degrees.dp},
                    {"tp", degrees.tp},
                    {"pp", degrees.pp},
                    {"micro_batches", degrees.micro_batches},
                    {"hsdp_level", degrees.hsdp_level}};
    j["predicted"] = {{"step_seconds", step_seconds},
                      {"memory_bytes", memory_bytes},
                      {"comm_bytes", comm_bytes}};
    auto ops = nlohmann::json::array();
    for (const auto& o : operators)
        ops.push_back({{"name", o.name},
                       {"kind", o.kind},
                       {"stage", o.stage},
                       {"in", std::string(to_string(o.choice.in))},
                       {"weight", std::string(to_string(o.choice.weight))},
                       {"weight_layout", weight_layout(o.choice.weight).to_string()},
                       {"out", std::string(to_string(o.choice.out))}});
    j["operators"] = ops;
    return j.dump(2) + "\n";
}

XSHARD_DECL operator_strategy operator_strategy::from_json(const std::string& text,
                                                           const std::string& path) {
    return detail::read_json_file(kind, path, [&] {
        const auto j = detail::read_envelope(text, kind).json;
        operator_strategy s;
        s.network = j.at("network").get<std::string>();
        s.batch = j.at("batch").get<std::size_t>();
        s.ranks = j.at("ranks").get<int>();
        const auto& d = j.at("degrees");
        s.degrees = {d.at("dp").get<int>(), d.at("tp").get<int>(), d.at("pp").get<int>(),
                     d.at("micro_batches").get<int>(), d.at("hsdp_level").get<int>()};
        if (s.degrees.dp < 1 || s.degrees.tp < 1 || s.degrees.pp < 1 ||
            s.degrees.micro_batches < 1 || s.degrees.hsdp_level < 0 || s.degrees.hsdp_level > 2)
            throw io_error("xshard: degrees out of range");
        if (std::int64_t(s.degrees.dp) * s.degrees.tp * s.degrees.pp != s.ranks)
            throw io_error("xshard: dp x tp x pp is not the " + std::to_string(s.ranks) +
                           " ranks");
        const auto& p = j.at("predicted");
        s.step_seconds = p.at("step_seconds").get<double>();
        s.memory_bytes = p.at("memory_bytes").get<double>();
        s.comm_bytes = p.at("comm_bytes").get<double>();
        for (const auto& o : j.at("operators"))
            s.operators.push_back(parse_operator(o));
        return s;
    });
}

XSHARD_DECL operator_strategy_entry operator_strategy::parse_operator(const nlohmann::json& o) {
    operator_strategy_entry e;
    e.name = o.at("name").get<std::string>();
    e.kind = o.at("kind").get<std::string>();
    e.stage = o.at("stage").get<int>();
    const auto in = parse_activation_split(o.at("in").get<std::string>());
    const auto out = parse_activation_split(o.at("out").get<std::string>());
    const auto w = parse_weight_split(o.at("weight").get<std::string>());
    if (!in || !out || !w)
        throw io_error("xshard: operator " + e.name + ": unknown split '" +
                       o.at(!in    ? "in"
                            : !out ? "out"
                                   : "weight")
                           .get<std::string>() +
                       "'");
    e.choice = {*in, *w, *out};
    return e;
}

XSHARD_DECL void save_operator_strategy(const std::string& path, const operator_strategy& s) {
    try {
        detail::write_file_atomically(path, s.to_json());
    } catch (const io_error&) {
        throw;
    } catch (const std::exception& e) {
        throw io_error("xshard: cannot write the operator strategy file " + path + ": " + e.what());
    }
}

} // namespace xshard

