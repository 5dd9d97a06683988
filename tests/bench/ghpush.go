package main

import (
	"fmt"
	"strings"
)

// repoURLs are the repository's API URLs in a push body, the same in every
// body: built once, so that the load generator spends its CPU, which the
// receivers share, on sending.
var repoURLs = func() string {
	api := "https://api.github.com/repos/bench-org/bench-repo"
	var urls []string
	for _, u := range []string{"forks", "keys{/key_id}", "collaborators{/collaborator}", "teams", "hooks", "issues/events{/number}",
		"events", "assignees{/user}", "branches{/branch}", "tags", "blobs{/sha}", "git/tags{/sha}", "git/refs{/sha}", "git/trees{/sha}",
		"statuses/{sha}", "languages", "stargazers", "contributors", "subscribers", "subscription", "commits{/sha}",
		"git/commits{/sha}", "comments{/number}", "issues/comments{/number}", "contents/{+path}", "compare/{base}...{head}",
		"merges", "{archive_format}{/ref}", "downloads", "issues{/number}", "pulls{/number}", "milestones{/number}",
		"notifications{?since,all,participating}", "labels{/name}", "releases{/id}", "deployments"} {
		name := strings.NewReplacer("{", "", "}", "", "/", "_", "+", "", "?", "", ",", "_", ".", "").Replace(u)
		urls = append(urls, fmt.Sprintf(`"%s_url":"%s/%s"`, name, api, u))
	}
	return strings.Join(urls, ",")
}()

// pushBody returns a GitHub push webhook body for delivery id, shaped as
// GitHub sends one (its ref and commits, the repository with its URLs, the
// pusher and the sender) and about 7 KB long, as a push of three commits
// to a repository of an organization is. The id makes every body unique.
func pushBody(id string) []byte {
	var commits []string
	for i := range 3 {
		sha := fmt.Sprintf("%040x", uint64(len(id))*0x9e3779b97f4a7c15+uint64(i))
		commits = append(commits, fmt.Sprintf(`{"id":"%s","tree_id":"%s","distinct":true,"message":"bench: change %d of delivery %s\n\nA longer description of what the change does and why, as commit messages have.","timestamp":"2026-11-30T12:00:0%dZ","url":"https://github.com/bench-org/bench-repo/commit/%s","author":{"name":"Bench Author","email":"author@example.com","username":"bench-author"},"committer":{"name":"GitHub","email":"noreply@github.com","username":"web-flow"},"added":["docs/notes-%d.md"],"removed":[],"modified":["internal/engine/engine.go","internal/engine/tx.go","README.md"]}`,
			sha, sha, i+1, id, i, sha, i))
	}
	return fmt.Appendf(nil, `{"ref":"refs/heads/main","before":"%040x","after":"%040x","repository":{"id":123456789,"node_id":"R_kgDOBench","name":"bench-repo","full_name":"bench-org/bench-repo","private":false,"owner":{"name":"bench-org","email":null,"login":"bench-org","id":987654,"node_id":"O_kgDOBench","avatar_url":"https://avatars.githubusercontent.com/u/987654?v=4","url":"https://api.github.com/users/bench-org","html_url":"https://github.com/bench-org","type":"Organization","site_admin":false},"html_url":"https://github.com/bench-org/bench-repo","description":"A repository the benchmark pushes to","fork":false,"url":"https://github.com/bench-org/bench-repo",%s,"created_at":1700000000,"updated_at":"2026-11-30T12:00:00Z","pushed_at":1764500000,"git_url":"git://github.com/bench-org/bench-repo.git","ssh_url":"git@github.com:bench-org/bench-repo.git","clone_url":"https://github.com/bench-org/bench-repo.git","homepage":null,"size":2048,"stargazers_count":42,"watchers_count":42,"language":"Go","has_issues":true,"has_projects":false,"has_downloads":true,"has_wiki":false,"has_pages":false,"forks_count":3,"archived":false,"disabled":false,"open_issues_count":7,"license":{"key":"mit","name":"MIT License","spdx_id":"MIT"},"topics":["webhooks","postgresql"],"visibility":"public","default_branch":"main","master_branch":"main","organization":"bench-org"},"pusher":{"name":"bench-author","email":"author@example.com"},"organization":{"login":"bench-org","id":987654,"url":"https://api.github.com/orgs/bench-org"},"sender":{"login":"bench-author","id":1234567,"node_id":"U_kgDOBench","avatar_url":"https://avatars.githubusercontent.com/u/1234567?v=4","url":"https://api.github.com/users/bench-author","html_url":"https://github.com/bench-author","type":"User","site_admin":false},"created":false,"deleted":false,"forced":false,"base_ref":null,"compare":"https://github.com/bench-org/bench-repo/compare/0000000000...%s","commits":[%s],"head_commit":%s,"delivery":"%s"}`,
		len(id), len(id)+1, repoURLs, id, strings.Join(commits, ","), commits[2], id)
}
