package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/destination/artifact"
)

// storeHelp describes where artifacts are kept.
const storeHelp = `artifact store URL: file:///abs/dir, azblob://container, s3://bucket or gs://bucket (default: $FENCED_STORE, else the folder PATH.artifacts beside a sqlite:PATH database)`

// artifactFlags are publish's flags for an artifact.
type artifactFlags struct {
	file        string
	contentType string
	store       string
}

func (f *artifactFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.file, "artifact", "", "upload this file as an artifact and publish a pointer to it instead of a payload")
	cmd.Flags().StringVar(&f.contentType, "content-type", "application/octet-stream", "the artifact's media type, recorded in its pointer")
	addStoreFlag(cmd, &f.store)
}

func addStoreFlag(cmd *cobra.Command, store *string) {
	cmd.Flags().StringVar(store, "store", "", storeHelp)
}

// storeURL is --store, else $FENCED_STORE, else a folder named after the SQLite file: one store
// per database, because Collect judges objects by the rows of the database it is given.
func (a *app) storeURL(cmd *cobra.Command, flag string) (string, error) {
	if cmd.Flags().Changed("store") {
		if flag == "" {
			return "", usagef("--store is empty; give an artifact store URL")
		}
		return flag, nil
	}
	if env := os.Getenv("FENCED_STORE"); env != "" {
		return env, nil
	}
	db := a.dbURL(cmd)
	path, ok := strings.CutPrefix(db, "sqlite:")
	if !ok {
		return "", usagef("no artifact store: give --store or set FENCED_STORE (only a sqlite: database has a default store)")
	}
	path = strings.TrimPrefix(path, "//")
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	abs, err := filepath.Abs(path + ".artifacts")
	if err != nil {
		return "", fmt.Errorf("artifact store beside %s: %w", path, err)
	}
	return artifact.FileURL(abs), nil
}

// openBucket opens the selected store; a URL that cannot name a store is a usage error.
func (a *app) openBucket(cmd *cobra.Command, flag string) (*artifact.Bucket, string, error) {
	u, err := a.storeURL(cmd, flag)
	if err != nil {
		return nil, "", err
	}
	b, err := artifact.OpenBucket(cmd.Context(), u)
	if err != nil {
		var inv *artifact.URLError
		if errors.As(err, &inv) {
			return nil, "", usagef("%s", err)
		}
		return nil, "", err
	}
	return b, u, nil
}

// publishArtifact is publish --artifact: the file is checked, the store opened, the object
// uploaded and then the pointer published; nothing is published unless the upload completed.
func (a *app) publishArtifact(cmd *cobra.Command, resource string, lp parsedLease, af *artifactFlags,
	opts []fenced.PublishOption, opID string, release bool) error {
	f, err := os.Open(af.file)
	if err != nil {
		return usagef("cannot read --artifact %s: %s; nothing was published", af.file, errors.Unwrap(err))
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return usagef("--artifact %s is not a regular file; nothing was published", af.file)
	}
	b, storeURL, err := a.openBucket(cmd, af.store)
	if err != nil {
		return err
	}
	defer b.Close()
	s, l, known, err := a.lease(cmd, resource, lp)
	if err != nil {
		return err
	}
	defer s.Close()
	aopts := []artifact.Option{artifact.WithContentType(af.contentType), artifact.WithPublishOptions(opts...)}
	var p artifact.Pointer
	if release {
		p, err = artifact.PublishAndRelease(cmd.Context(), l, b, f, aopts...)
	} else {
		p, err = artifact.Publish(cmd.Context(), l, b, f, aopts...)
	}
	if err != nil {
		return withoutGuessedEpoch(err, known)
	}
	return a.print(map[string]any{"resource": l.Resource(), "token": l.Token().String(), "published_generation": l.Generation(),
		"published_epoch": l.Epoch(), "op_id": opID, "released": release, "store": storeURL, "artifact": p})
}

// getArtifact writes the artifact that payload points to, verified, to standard output or to
// output (through a temporary file renamed only once every byte was verified).
func (a *app) getArtifact(cmd *cobra.Command, s *fenced.Store, resource string, payload []byte, storeFlag, output string) error {
	if _, err := artifact.DecodePointer(resource, payload); err != nil {
		return err
	}
	b, _, err := a.openBucket(cmd, storeFlag)
	if err != nil {
		return err
	}
	defer b.Close()
	r, err := artifact.Open(cmd.Context(), s, b, resource)
	if err != nil {
		return err
	}
	defer r.Close()
	if output == "" {
		if _, err := r.WriteTo(a.stdout); err != nil {
			return fmt.Errorf("%w; what was written to standard output before this error is not to be trusted", err)
		}
		return nil
	}
	tmp, err := os.CreateTemp(filepath.Dir(output), ".fenced-get-*")
	if err != nil {
		return fmt.Errorf("get: %w", err)
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	if _, err := r.WriteTo(tmp); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("%w; %s was not written", err, output)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("get: %w", err)
	}
	return os.Rename(tmp.Name(), output)
}

// maxPointerBytes bounds a pointer payload: a key of at most 1024 bytes and a few fields.
const maxPointerBytes = 4096

// pointerJSON is what get --pointer prints, and show's "artifact".
type pointerJSON struct {
	artifact.Pointer
	Generation int64 `json:"generation"`
}

// publishedPointer is the resource's published pointer for show, or nil when the published
// payload is not one. A payload larger than any pointer is not read.
func publishedPointer(ctx context.Context, s *fenced.Store, st fenced.State) (*pointerJSON, error) {
	if st.PublishedGeneration == 0 || st.PayloadSize > maxPointerBytes {
		return nil, nil
	}
	resource := st.Resource
	p, gen, err := artifact.ReadPointer(ctx, s, resource)
	switch {
	case errors.Is(err, artifact.ErrNotArtifact), errors.Is(err, fenced.ErrNothingPublished):
		return nil, nil
	case err != nil:
		return nil, err
	}
	return &pointerJSON{p, gen}, nil
}

func (a *app) gcCmd() *cobra.Command {
	var (
		olderThan string
		dryRun    bool
		store     string
	)
	cmd := &cobra.Command{
		Use:   "gc --older-than DURATION [--dry-run]",
		Short: "Delete artifacts that no published pointer names and no attempt can publish",
		Long: `Delete the store's artifacts that are older than DURATION, that no published pointer
names, and whose attempt can never publish: a later acquisition superseded it, or its
generation already published or released. The current holder's upload is kept whatever its
age, so a paused holder that publishes later never leaves a pointer to a deleted object. Use
one store per database: objects are judged by this database's rows. Prints what was deleted
(or, with --dry-run, what would be) and how many bytes.`,
		Args: cobra.NoArgs,
		RunE: a.run(func(cmd *cobra.Command, _ []string) error {
			d, err := time.ParseDuration(olderThan)
			if err != nil || d < 0 {
				return usagef("invalid --older-than %q: use a duration such as 24h (0s collects every finished attempt)", olderThan)
			}
			b, _, err := a.openBucket(cmd, store)
			if err != nil {
				return err
			}
			defer b.Close()
			s, err := a.open(cmd)
			if err != nil {
				return err
			}
			defer s.Close()
			rep, err := artifact.Collect(cmd.Context(), s, b, d, dryRun)
			if err != nil {
				return err
			}
			type deleted struct {
				Key        string `json:"key"`
				Resource   string `json:"resource"`
				Epoch      int64  `json:"epoch"`
				Generation int64  `json:"generation"`
				Bytes      int64  `json:"bytes"`
			}
			out := []deleted{}
			for _, c := range rep.Deleted {
				out = append(out, deleted{c.Key, c.Resource, c.Token.Epoch, c.Token.Generation, c.Size})
			}
			return a.print(map[string]any{"dry_run": dryRun, "deleted": out, "deleted_bytes": rep.Bytes,
				"kept": rep.Kept, "skipped": append([]string{}, rep.Skipped...), "staged_deleted": rep.Staged})
		}),
	}
	cmd.Flags().StringVar(&olderThan, "older-than", "", "only objects at least this old, e.g. 24h (required)")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "delete nothing; print what would be deleted")
	addStoreFlag(cmd, &store)
	_ = cmd.MarkFlagRequired("older-than")
	return cmd
}

// writeFileAtomic writes data to path through a temporary file renamed into place.
func writeFileAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".fenced-get-*")
	if err != nil {
		return fmt.Errorf("get: %w", err)
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	if _, err := tmp.Write(data); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("get: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("get: %w", err)
	}
	return os.Rename(tmp.Name(), path)
}

// runArtifactFlags are run's flags for an artifact.
type runArtifactFlags struct {
	on          bool
	contentType string
	store       string
}

func (f *runArtifactFlags) add(cmd *cobra.Command) {
	cmd.Flags().BoolVar(&f.on, "artifact", false, "stream the command's standard output into an artifact and publish a pointer to it")
	cmd.Flags().StringVar(&f.contentType, "content-type", "application/octet-stream", "with --artifact, the artifact's media type")
	addStoreFlag(cmd, &f.store)
}

// runArtifact is run --artifact: the store is opened before the lease is taken, so that a bad
// store URL costs no generation.
func (a *app) runArtifact(cmd *cobra.Command, args []string, opts *fenced.RunOptions, grace time.Duration, azureLease bool, f *runArtifactFlags) error {
	b, storeURL, err := a.openBucket(cmd, f.store)
	if err != nil {
		return err
	}
	defer b.Close()
	s, err := a.open(cmd)
	if err != nil {
		return err
	}
	defer s.Close()
	build := artifact.Build(b, func(ctx context.Context, l *fenced.Lease, w io.Writer) error {
		return a.runCommandTo(ctx, l, args[1:], grace, azureLease, w)
	}, artifact.WithContentType(f.contentType))
	var p artifact.Pointer
	res, err := fenced.Run(cmd.Context(), s, args[0], opts,
		func(ctx context.Context, l *fenced.Lease) ([]byte, error) {
			payload, err := build(ctx, l)
			if err == nil {
				p, err = artifact.DecodePointer(l.Resource(), payload)
			}
			return payload, err
		})
	if err != nil {
		return err
	}
	return a.print(map[string]any{"resource": res.Resource, "owner": res.Owner, "token": res.Token.String(),
		"epoch": res.Token.Epoch, "generation": res.Generation, "published_generation": res.Generation, "store": storeURL, "artifact": p})
}
