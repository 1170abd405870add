#pragma once
// A mixture of experts' rows sent to their experts' ranks and back under sw::expert_parallelize: the counts of rows
// per expert first, then the rows, grouped on arrival so that each local expert computes once on every rank's rows
// for it, and the results back in the order they were sent.
#include <Eigen/Core>
#include <cstddef>
#include <span>
#include <vector>

#include "shardwise/nn/experts/expert_parallel.hpp"
#include "shardwise/nn/kernels/functional_types.hpp"

namespace shardwise {

/// One block's exchange of rows with the ep ranks, for a forward and its backward (which sends rows laid out as
/// the forward's, so it reuses the forward's counts). A module keeps it among its saved activations.
template <class T>
class expert_dispatch {
 public:
  /// The results for `routed`, the rows of every expert in turn (rows_of[e] of expert e of all the experts), of
  /// compute(l, rows) on this rank's local experts in turn (`local` of them; their forward, or backward), each on
  /// every rank's rows for it, in rank order. A forward exchanges the counts first, refusing on every rank with
  /// refuse(token, rank) when a rank says its router met a token with no finite scores (`unroutable`: that
  /// token, or -1).
  template <class Compute, class Refuse>
  nn::matrix<T> run(expert_parallel const& placed, nn::matrix<T> const& routed, std::vector<std::size_t> const& rows_of,
                    std::size_t local, bool forward, Eigen::Index unroutable, Compute&& compute, Refuse&& refuse) {
    auto const ranks = static_cast<std::size_t>(placed.size());
    if (forward) counts_ = exchange_counts(placed, rows_of, local, unroutable, refuse);
    std::vector<std::size_t> rows_to(ranks, 0);
    for (std::size_t e = 0; e < rows_of.size(); ++e) rows_to[e / local] += rows_of[e];
    nn::matrix<T> arrived, result;
    std::vector<std::size_t> const from = placed.exchange(routed, rows_to, arrived);
    nn::matrix<T> grouped(arrived.rows(), arrived.cols());
    regroup(arrived, grouped, true);
    nn::matrix<T> computed(grouped.rows(), grouped.cols());
    Eigen::Index at = 0;
    for (std::size_t l = 0; l < local; ++l) {
      auto const rows = static_cast<Eigen::Index>(counts_.col(static_cast<Eigen::Index>(l)).sum());
      computed.middleRows(at, rows) = compute(l, nn::matrix<T>(grouped.middleRows(at, rows)));
      at += rows;
    }
    nn::matrix<T> back(computed.rows(), computed.cols());
    regroup(computed, back, false);
    (void)placed.exchange(back, from, result);
    return result;
  }

  /// The rows this rank's experts computed in the last forward: every ep rank's rows routed to them.
  [[nodiscard]] std::size_t arrived_rows() const { return static_cast<std::size_t>(counts_.sum()); }

 private:
  /// Every rank's rows for each of this rank's local experts: counts(q, l) from rank q for local expert l. A rank
  /// whose router met an unroutable token sends that instead (as -1 - token), and every rank refuses alike.
  template <class Refuse>
  static nn::matrix<double> exchange_counts(expert_parallel const& placed, std::vector<std::size_t> const& rows_of,
                                            std::size_t local, Eigen::Index unroutable, Refuse& refuse) {
    auto const ranks = static_cast<Eigen::Index>(placed.size());
    nn::matrix<double> mine(ranks, static_cast<Eigen::Index>(local)), counts;  // double: exact counts up to 2^53
    for (std::size_t e = 0; e < rows_of.size(); ++e)
      mine(static_cast<Eigen::Index>(e / local), static_cast<Eigen::Index>(e % local)) =
          static_cast<double>(rows_of[e]);
    if (unroutable >= 0) mine.setConstant(-1 - static_cast<double>(unroutable));
    std::vector<std::size_t> const one_row(static_cast<std::size_t>(ranks), 1);
    (void)placed.exchange(mine, one_row, counts);
    for (Eigen::Index q = 0; q < counts.rows(); ++q)
      if (counts.cols() > 0 && counts(q, 0) < 0) refuse(static_cast<Eigen::Index>(-1 - counts(q, 0)), int(q));
    return counts;
  }

  /// Rows as they arrive (rank by rank, each rank's expert by expert) into rows expert by expert (each expert's
  /// rank by rank), or back.
  void regroup(nn::matrix<T> const& in, nn::matrix<T>& out, bool to_experts) const {
    Eigen::Index at = 0;
    for (Eigen::Index l = 0; l < counts_.cols(); ++l)
      for (Eigen::Index q = 0; q < counts_.rows(); ++q) {
        auto const rows = static_cast<Eigen::Index>(counts_(q, l));
        Eigen::Index const source = arrived_at(q, l);
        if (to_experts)
          out.middleRows(at, rows) = in.middleRows(source, rows);
        else
          out.middleRows(source, rows) = in.middleRows(at, rows);
        at += rows;
      }
  }
  /// Where rank q's rows for local expert l start among the rows that arrived.
  [[nodiscard]] Eigen::Index arrived_at(Eigen::Index q, Eigen::Index l) const {
    double const before = counts_.topRows(q).sum() + counts_.row(q).head(l).sum();
    return static_cast<Eigen::Index>(before);
  }

  nn::matrix<double> counts_;  // of the last forward: rows from each ep rank (row) for each local expert (column)
};

}  // namespace shardwise
