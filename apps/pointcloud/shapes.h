#pragma once
// The generated point-cloud data set of cf-pointcloud: parametric 3-D shapes,
// points sampled on their surfaces (each part chosen in proportion to its area),
// a random per-axis stretch, Gaussian noise, a uniform random rotation, then
// centred and scaled into the unit sphere. Deterministic in its seed.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace cf::apps::pointcloud {

using Vec3 = std::array<double, 3>;
constexpr double kPi = 3.14159265358979323846;

inline const std::vector<std::string>& shape_names() {
  static const std::vector<std::string> names = {"sphere",  "ellipsoid", "cube",    "cylinder",
                                                 "cone",    "torus",     "pyramid", "sheet",
                                                 "helix",   "capsule",   "dumbbell", "tetrahedron"};
  return names;
}

struct ShapeDataConfig {
  int64_t points = 256;
  double noise = 0.01;         // Gaussian noise std, relative to the shape's size (about 1)
  double scale_jitter = 0.2;   // each axis stretched by a factor in [1 - s, 1 + s]
  int64_t train_per_class = 100, val_per_class = 20, test_per_class = 30;
  int64_t data_seed = 0;
  std::string rotation = "so3";  // so3: uniform random rotation; z: about the z axis; none
  std::string align = "pca";     // pca: turned onto the principal axes after normalising; none
};

// Eigenvectors of a symmetric 3x3 matrix (Jacobi rotations), as the columns of
// `vec`, ordered by decreasing eigenvalue.
inline void symmetric_eigen3(std::array<double, 9> a, std::array<double, 9>& vec) {
  vec = {1, 0, 0, 0, 1, 0, 0, 0, 1};
  for (int sweep = 0; sweep < 50; ++sweep) {
    const double off = a[1] * a[1] + a[2] * a[2] + a[5] * a[5];
    if (off < 1e-30) break;
    for (int p = 0; p < 2; ++p)
      for (int q = p + 1; q < 3; ++q) {
        const double apq = a[size_t(3 * p + q)];
        if (std::abs(apq) < 1e-300) continue;
        const double app = a[size_t(4 * p)], aqq = a[size_t(4 * q)];
        const double theta = 0.5 * std::atan2(2 * apq, aqq - app);
        const double c = std::cos(theta), s = std::sin(theta);
        // a <- J^T a J, vec <- vec J with J the rotation in the (p, q) plane.
        for (int k = 0; k < 3; ++k) {
          const double akp = a[size_t(3 * k + p)], akq = a[size_t(3 * k + q)];
          a[size_t(3 * k + p)] = c * akp - s * akq;
          a[size_t(3 * k + q)] = s * akp + c * akq;
        }
        for (int k = 0; k < 3; ++k) {
          const double apk = a[size_t(3 * p + k)], aqk = a[size_t(3 * q + k)];
          a[size_t(3 * p + k)] = c * apk - s * aqk;
          a[size_t(3 * q + k)] = s * apk + c * aqk;
        }
        for (int k = 0; k < 3; ++k) {
          const double vkp = vec[size_t(3 * k + p)], vkq = vec[size_t(3 * k + q)];
          vec[size_t(3 * k + p)] = c * vkp - s * vkq;
          vec[size_t(3 * k + q)] = s * vkp + c * vkq;
        }
      }
  }
  int order[3] = {0, 1, 2};
  std::sort(order, order + 3, [&](int i, int j) { return a[size_t(4 * i)] > a[size_t(4 * j)]; });
  std::array<double, 9> sorted;
  for (int k = 0; k < 3; ++k)
    for (int j = 0; j < 3; ++j) sorted[size_t(3 * k + j)] = vec[size_t(3 * k + order[j])];
  vec = sorted;
}

struct ShapeSet {
  std::vector<float> xyz;       // (count, points, 3)
  std::vector<int64_t> labels;  // (count)
  int64_t count() const { return int64_t(labels.size()); }
};

class ShapeSampler {
 public:
  explicit ShapeSampler(uint64_t seed) : rng_(seed) {}

  double uniform(double a = 0, double b = 1) { return std::uniform_real_distribution<double>(a, b)(rng_); }
  double normal() { return std::normal_distribution<double>(0.0, 1.0)(rng_); }

  Vec3 on_sphere(double r) {
    Vec3 v{normal(), normal(), normal()};
    const double n = std::sqrt(v[0] * v[0] + v[1] * v[1] + v[2] * v[2]) + 1e-12;
    return {r * v[0] / n, r * v[1] / n, r * v[2] / n};
  }
  Vec3 on_triangle(const Vec3& a, const Vec3& b, const Vec3& c) {
    double u = uniform(), v = uniform();
    if (u + v > 1) {
      u = 1 - u;
      v = 1 - v;
    }
    Vec3 p;
    for (size_t i = 0; i < 3; ++i) p[i] = a[i] + u * (b[i] - a[i]) + v * (c[i] - a[i]);
    return p;
  }
  // Side (lateral) surface of a z-aligned cylinder of radius r, z in [z0, z1].
  Vec3 on_tube(double r, double z0, double z1) {
    const double t = uniform(0, 2 * kPi);
    return {r * std::cos(t), r * std::sin(t), uniform(z0, z1)};
  }
  Vec3 on_disk(double r, double z) {
    const double t = uniform(0, 2 * kPi), s = r * std::sqrt(uniform());
    return {s * std::cos(t), s * std::sin(t), z};
  }
  // Picks part i with probability weights[i] / sum.
  size_t pick(const std::vector<double>& weights) {
    double total = 0;
    for (double w : weights) total += w;
    double u = uniform(0, total);
    for (size_t i = 0; i < weights.size(); ++i) {
      if (u < weights[i]) return i;
      u -= weights[i];
    }
    return weights.size() - 1;
  }

  Vec3 point_on(int64_t cls) {
    switch (cls) {
      case 0:  // sphere
        return on_sphere(1.0);
      case 1: {  // ellipsoid with axes 1, 0.6, 0.35
        Vec3 p = on_sphere(1.0);
        return {p[0], 0.6 * p[1], 0.35 * p[2]};
      }
      case 2: {  // cube surface
        const int face = int(uniform(0, 6));
        Vec3 p{uniform(-1, 1), uniform(-1, 1), uniform(-1, 1)};
        p[size_t(face % 3)] = face < 3 ? -1.0 : 1.0;
        return p;
      }
      case 3: {  // closed cylinder, radius 0.5, height 2
        const size_t part = pick({2 * kPi * 0.5 * 2, kPi * 0.25, kPi * 0.25});
        if (part == 0) return on_tube(0.5, -1, 1);
        return on_disk(0.5, part == 1 ? -1.0 : 1.0);
      }
      case 4: {  // cone, base radius 0.8 at z = -1, apex at z = 1
        const double r = 0.8, h = 2, slant = std::sqrt(r * r + h * h);
        if (pick({kPi * r * slant, kPi * r * r}) == 1) return on_disk(r, -1);
        const double t = std::sqrt(uniform()), a = uniform(0, 2 * kPi);  // t: distance from the apex / slant
        return {r * t * std::cos(a), r * t * std::sin(a), 1 - h * t};
      }
      case 5: {  // torus R = 0.75, r = 0.25 (rejection for the area element R + r cos phi)
        const double big = 0.75, small = 0.25;
        double phi;
        do phi = uniform(0, 2 * kPi);
        while (uniform(0, big + small) > big + small * std::cos(phi));
        const double t = uniform(0, 2 * kPi), rr = big + small * std::cos(phi);
        return {rr * std::cos(t), rr * std::sin(t), small * std::sin(phi)};
      }
      case 6: {  // square pyramid: base 2 x 2 at z = -0.75, apex at z = 0.75
        const Vec3 apex{0, 0, 0.75};
        const Vec3 c[4] = {{-1, -1, -0.75}, {1, -1, -0.75}, {1, 1, -0.75}, {-1, 1, -0.75}};
        const double side = std::sqrt(1 + 1.5 * 1.5);  // slant height of a face
        const size_t part = pick({4, side, side, side, side});
        if (part == 0) return {uniform(-1, 1), uniform(-1, 1), -0.75};
        return on_triangle(apex, c[part - 1], c[part % 4]);
      }
      case 7:  // square sheet
        return {uniform(-1, 1), uniform(-1, 1), 0.0};
      case 8: {  // helix tube: 3 turns, radius 0.6, height 2, tube radius 0.12
        const double s = uniform(), t = s * 3 * 2 * kPi, psi = uniform(0, 2 * kPi), tube = 0.12;
        const Vec3 radial{std::cos(t), std::sin(t), 0};
        return {0.6 * radial[0] + tube * std::cos(psi) * radial[0], 0.6 * radial[1] + tube * std::cos(psi) * radial[1],
                -1 + 2 * s + tube * std::sin(psi)};
      }
      case 9: {  // capsule: radius 0.4, cylinder part z in [-0.6, 0.6], hemispherical caps
        const double r = 0.4, h = 0.6;
        if (pick({2 * kPi * r * 2 * h, 4 * kPi * r * r}) == 0) return on_tube(r, -h, h);
        Vec3 p = on_sphere(r);
        p[2] += p[2] >= 0 ? h : -h;
        return p;
      }
      case 10: {  // dumbbell: two spheres of radius 0.45 at z = +-0.75 joined by a rod of radius 0.1
        const double r = 0.45, rod = 0.1, len = 2 * (0.75 - r);
        const size_t part = pick({4 * kPi * r * r, 4 * kPi * r * r, 2 * kPi * rod * len});
        if (part == 2) return on_tube(rod, -0.75 + r, 0.75 - r);
        Vec3 p = on_sphere(r);
        p[2] += part == 0 ? -0.75 : 0.75;
        return p;
      }
      default: {  // regular tetrahedron
        const Vec3 v[4] = {{1, 1, 1}, {1, -1, -1}, {-1, 1, -1}, {-1, -1, 1}};
        const size_t f = size_t(uniform(0, 4)) % 4;
        return on_triangle(v[f], v[(f + 1) % 4], v[(f + 2) % 4]);
      }
    }
  }

  // A uniform random rotation: the unit quaternion of 4 Gaussians.
  std::array<double, 9> rotation() {
    double q[4] = {normal(), normal(), normal(), normal()};
    const double n = std::sqrt(q[0] * q[0] + q[1] * q[1] + q[2] * q[2] + q[3] * q[3]) + 1e-12;
    const double w = q[0] / n, x = q[1] / n, y = q[2] / n, z = q[3] / n;
    return {1 - 2 * (y * y + z * z), 2 * (x * y - z * w),     2 * (x * z + y * w),
            2 * (x * y + z * w),     1 - 2 * (x * x + z * z), 2 * (y * z - x * w),
            2 * (x * z - y * w),     2 * (y * z + x * w),     1 - 2 * (x * x + y * y)};
  }

  // One cloud of class `cls`, appended to `out` (points * 3 floats).
  void cloud(int64_t cls, const ShapeDataConfig& c, std::vector<float>& out) {
    const Vec3 stretch{uniform(1 - c.scale_jitter, 1 + c.scale_jitter), uniform(1 - c.scale_jitter, 1 + c.scale_jitter),
                       uniform(1 - c.scale_jitter, 1 + c.scale_jitter)};
    std::array<double, 9> rot = {1, 0, 0, 0, 1, 0, 0, 0, 1};
    if (c.rotation == "so3") {
      rot = rotation();
    } else if (c.rotation == "z") {
      const double t = uniform(0, 2 * kPi);
      rot = {std::cos(t), -std::sin(t), 0, std::sin(t), std::cos(t), 0, 0, 0, 1};
    }
    std::vector<Vec3> pts(size_t(c.points));
    Vec3 mean{0, 0, 0};
    for (Vec3& p : pts) {
      Vec3 q = point_on(cls);
      for (size_t i = 0; i < 3; ++i) q[i] = q[i] * stretch[i] + c.noise * normal();
      for (size_t i = 0; i < 3; ++i) p[i] = rot[3 * i] * q[0] + rot[3 * i + 1] * q[1] + rot[3 * i + 2] * q[2];
      for (size_t i = 0; i < 3; ++i) mean[i] += p[i] / double(c.points);
    }
    double radius = 1e-12;
    for (Vec3& p : pts) {
      for (size_t i = 0; i < 3; ++i) p[i] -= mean[i];
      radius = std::max(radius, std::sqrt(p[0] * p[0] + p[1] * p[1] + p[2] * p[2]));
    }
    if (c.align == "pca") {
      // Principal axes: coordinates along the eigenvectors of the covariance
      // (largest variance first), each axis' sign chosen so its third moment is
      // positive; undoes the rotation up to the shape's own symmetries.
      std::array<double, 9> cov{};
      for (const Vec3& p : pts)
        for (size_t i = 0; i < 3; ++i)
          for (size_t j = 0; j < 3; ++j) cov[3 * i + j] += p[i] * p[j];
      std::array<double, 9> vec;
      symmetric_eigen3(cov, vec);
      for (size_t j = 0; j < 3; ++j) {
        double m3 = 0;
        for (const Vec3& p : pts) {
          const double t = p[0] * vec[j] + p[1] * vec[3 + j] + p[2] * vec[6 + j];
          m3 += t * t * t;
        }
        if (m3 < 0)
          for (size_t i = 0; i < 3; ++i) vec[3 * i + j] = -vec[3 * i + j];
      }
      for (Vec3& p : pts) {
        const Vec3 q = p;
        for (size_t j = 0; j < 3; ++j) p[j] = q[0] * vec[j] + q[1] * vec[3 + j] + q[2] * vec[6 + j];
      }
    }
    for (const Vec3& p : pts)
      for (size_t i = 0; i < 3; ++i) out.push_back(float(p[i] / radius));
  }

 private:
  std::mt19937_64 rng_;
};

// `per_class` clouds of every class, classes interleaved; `stream` separates the
// train, validation and test sets drawn from one data seed.
inline ShapeSet make_shapes(const ShapeDataConfig& c, int64_t per_class, uint64_t stream) {
  ShapeSampler s(uint64_t(c.data_seed) * 1000003ull + stream * 7919ull + 17ull);
  ShapeSet set;
  const int64_t classes = int64_t(shape_names().size());
  set.xyz.reserve(size_t(per_class * classes * c.points * 3));
  for (int64_t i = 0; i < per_class; ++i)
    for (int64_t k = 0; k < classes; ++k) {
      s.cloud(k, c, set.xyz);
      set.labels.push_back(k);
    }
  return set;
}

}  // namespace cf::apps::pointcloud
