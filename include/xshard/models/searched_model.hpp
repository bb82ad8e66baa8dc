#pragma once
/// \file
/// What every searched model (models/searched_mlp.hpp, models/searched_transformer.hpp) holds
/// and does with its strategies, written once: the network the search prices (`spec()`), the
/// strategies in use (`choices()`), and `apply_strategy`, which checks a chain of strategies
/// against the network on the model's mesh (`check_strategy_chain`) and hands it to the
/// model's `lay_out`, which moves the weights. A model derives from
/// `detail::searched_model<itself>`:
///
///     class searched_mlp : public detail::searched_model<searched_mlp<T, Mesh>> { ...
///         friend class detail::searched_model<searched_mlp>;
///         void lay_out(const std::vector<op_choice>& c);   // the operators' set(c[i])
///     };

#include <xshard/comm/error.hpp>
#include <xshard/core/mesh.hpp>
#include <xshard/core/mesh_shape.hpp>
#include <xshard/core/op_choice.hpp>
#include <xshard/search/network_spec.hpp>
#include <xshard/search/op_options.hpp>

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace xshard::detail {

/// Throws xshard::error (alike on every rank: shared data) unless `c` holds one strategy per
/// operator of `net`, each suits its operator on `mesh`'s dp x tp, the first takes rows
/// ([dp, -]), each takes what the previous one gives, and the last gives rows split over dp
/// only (the labels' split). `who` names the model in the message.
inline void check_strategy_chain(const network_spec& net, const std::vector<op_choice>& c,
                                 const mesh_shape& mesh, std::string_view who) {
    const std::string name(who);
    if (c.size() != net.ops.size())
        throw error("xshard: " + name + ": " + std::to_string(c.size()) + " strategies for " +
                    std::to_string(net.ops.size()) + " operators");
    const int dp = mesh.axis_size("dp"), tp = mesh.axis_size("tp");
    for (std::size_t i = 0; i < c.size(); ++i) {
        const auto& op = net.ops[i];
        const auto options = op_options(op, c[i].in, dp, tp, net.batch);
        bool ok = false;
        for (const auto& o : options)
            ok = ok || o.first == c[i].weight;
        const auto expected = i == 0 ? activation_split::rows : c[i - 1].out;
        if (!ok || c[i].in != expected)
            throw error("xshard: " + name + ": operator " + op.name + " cannot run with in " +
                        std::string(to_string(c[i].in)) + ", weight " +
                        std::string(to_string(c[i].weight)) + " after " +
                        std::string(to_string(expected)));
    }
    if (c.back().out == activation_split::all_rows)
        throw error("xshard: " + name +
                    ": the output must keep its rows over dp (the labels' split), not " +
                    std::string(to_string(c.back().out)));
}

/// The strategies of a searched model `Model` (see the file comment). `Model` has
/// `lay_out(choices)`, which lays its operators out under a checked chain of strategies
/// (collective over its mesh).
template <class Model>
class searched_model {
public:
    /// The network the search prices.
    const network_spec& spec() const noexcept { return spec_; }
    /// The strategies in use, one per operator.
    const std::vector<op_choice>& choices() const noexcept { return choices_; }

    /// Sets every operator's strategy (one per operator of `spec()`), moving the weights to
    /// their new layouts (their values kept; gradients zeroed, optimizer state dropped).
    /// Throws xshard::error, on every rank alike, for a strategy that does not suit its
    /// operator or a chain whose neighbours do not meet. Collective over the mesh.
    void apply_strategy(const std::vector<op_choice>& c) {
        check_strategy_chain(spec_, c, mesh_, name_);
        choices_ = c;
        static_cast<Model&>(*this).lay_out(c);
    }

protected:
    /// The model `name` (a literal, for messages) of network `spec` on `mesh`, every operator
    /// data parallel ([dp, -] rows, weights replicated). Throws xshard::error unless the mesh
    /// has axes dp and tp.
    template <mesh_type Mesh>
    searched_model(const Mesh& mesh, network_spec spec, const char* name)
        : mesh_(mesh.shape())
        , spec_(std::move(spec))
        , name_(name) {
        if (!mesh.has_axis("dp") || !mesh.has_axis("tp"))
            throw error("xshard: " + std::string(name) + ": the mesh " + mesh.shape().to_string() +
                        " needs axes dp and tp");
        choices_.assign(spec_.ops.size(), {});
    }

private:
    mesh_shape mesh_;
    network_spec spec_;
    const char* name_;
    std::vector<op_choice> choices_;
};

} // namespace xshard::detail
