"""K-Means from Python (the library behind cf-kmeans): planted clusters recovered."""
import cf

gen = cf.Generator(0)
centers = cf.randn([8, 16], generator=gen, std=4.0)
labels = cf.randint(0, 8, [5000], generator=gen)
x = cf.index_select(centers, 0, labels) + cf.randn([5000, 16], generator=gen)
centroids, assignments, inertia = cf.kmeans(x, 8, seed=1, on_iteration=lambda it, j: print("iteration", it, "inertia", round(j, 1)))
print("inertia %.1f, adjusted Rand index vs the planted labels: %.3f" % (inertia, cf.adjusted_rand_index(assignments, labels)))
